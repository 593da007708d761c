// Says loudly, before the suite runs, which real services the integration tests will use or skip.
// With CI=true a missing service fails the run: CI must never pass by skipping.
import net from 'node:net';

const services = [
  ['Redis', process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', 6379],
  ['PostgreSQL', process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test', 5432],
  // The queue consumers guide's test (docs/test/queues-guide.int.test.ts) runs on real brokers.
  ['RabbitMQ', process.env.RABBITMQ_URL ?? 'amqp://guest:guest@127.0.0.1:5672', 5672],
  ['NATS', process.env.NATS_URL ?? 'nats://127.0.0.1:4222', 4222],
];

const reachable = (url, fallbackPort) =>
  new Promise((resolve) => {
    const { hostname, port } = new URL(url);
    const socket = net.connect({ host: hostname || '127.0.0.1', port: Number(port || fallbackPort) });
    socket.setTimeout(1500);
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('timeout', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', () => resolve(false));
  });

let missing = 0;
for (const [name, url, port] of services) {
  if (await reachable(url, port)) continue;
  missing++;
  console.warn(`\n!!! ${name} is not reachable at ${url}: its integration tests will be SKIPPED.\n`);
}
if (missing > 0 && process.env.CI === 'true') {
  console.error('CI=true and a required service is missing: failing the run.');
  process.exit(1);
}
