// @idem/redis claim+complete cycles per second, next to the raw `SET NX PX` rate that redis-benchmark
// gets from the same Redis in the same run, at 1 and 50 concurrent callers.
// Run: node --import tsx benchmarks/stores-redis.bench.mjs (or `npm run bench -- stores-redis`).
//
// The bench starts its own redis-server on a free loopback port with no persistence (the setup of
// research/perf-limits.md). Then no other work on the shared Redis gets in the way, and both sides
// measure one server. One cycle is two round trips (the claim script, then the completion script),
// so the target is a ratio of at least 0.40 against raw SET NX PX at 50 callers.
import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { promisify } from 'node:util';
import { createIdempotency } from '@idem/core';
import { redisStore } from '@idem/redis';
import { Redis } from 'ioredis';

const run = promisify(execFile);
const durationMs = Number(process.env.BENCH_MS ?? 3_000);
const quick = process.env.BENCH_QUICK === '1';
const requests = quick ? 50_000 : 100_000;
const rounds = quick ? 1 : 3;

const freePort = () =>
  new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });

const port = await freePort();
const server = spawn(
  'redis-server',
  ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
  {
    stdio: 'ignore',
  },
);
const stopServer = () => {
  if (server.exitCode === null) server.kill('SIGKILL');
};
process.on('exit', stopServer);

try {
  const client = new Redis(port, '127.0.0.1', { retryStrategy: (times) => (times > 50 ? null : 20) });
  client.on('error', () => {});
  await client.ping();

  // redis-benchmark: random keys, like a real claim, over `clients` connections.
  const raw = async (clients) => {
    await client.flushall();
    const { stdout } = await run('redis-benchmark', [
      ...[
        '-h',
        '127.0.0.1',
        '-p',
        String(port),
        '-n',
        String(requests),
        '-c',
        String(clients),
        '-r',
        '100000000',
        '--csv',
      ],
      ...['SET', 'bench:__rand_int__', 'v', 'NX', 'PX', '86400000'],
    ]);
    const row = stdout.trim().split('\n').at(-1) ?? '';
    const rps = Number(row.split(',')[1]?.replaceAll('"', ''));
    if (!Number.isFinite(rps)) throw new Error(`could not read redis-benchmark output: ${stdout}`);
    return Math.round(rps);
  };

  // `callers` loops, each running one operation after the other, for durationMs of wall time.
  const measure = async (callers, operation) => {
    await client.flushall();
    for (let i = 0; i < 2_000; i++) await operation(); // warm up the JIT and the script cache
    let done = 0;
    const started = performance.now();
    const end = started + durationMs;
    await Promise.all(
      Array.from({ length: callers }, async () => {
        while (performance.now() < end) {
          await operation();
          done++;
        }
      }),
    );
    return Math.round(done / ((performance.now() - started) / 1_000));
  };

  const store = redisStore({ client, prefix: 'bench:idem:' });
  const response = {
    status: 201,
    headers: { 'content-type': 'application/json' },
    body: new TextEncoder().encode('{"id":"ch_1"}'),
  };
  const cycle = async () => {
    const id = randomUUID();
    const token = randomUUID();
    const claimed = await store.claim({ id, token, fingerprint: 'fp', leaseMs: 10_000 });
    if (!claimed.claimed) throw new Error('fresh id not claimed');
    if (!(await store.complete({ id, token, response, retentionMs: 86_400_000 }))) throw new Error('complete refused');
  };
  const engine = createIdempotency({ store, heartbeat: false });
  const engineCycle = async () => {
    const started = await engine.begin({
      key: randomUUID(),
      scope: 'user:1',
      operation: 'POST /charges',
      fingerprint: 'fp',
    });
    if (started.kind !== 'execute') throw new Error(`expected execute, got ${started.kind}`);
    await engine.complete(started.lease, response);
  };

  // The same SET NX PX sent from this process through the same client: what a cycle's two round trips
  // cost at best from Node, so the client's own overhead is not counted against the store.
  const nodeSet = () => client.set(`bench:${randomUUID()}`, 'v', 'PX', 86_400_000, 'NX');

  // Contenders take turns, round after round, and each reports its median: on a shared 2-core box
  // the load drifts, and interleaving spreads that drift over every contender alike.
  const contenders = {
    raw1: () => raw(1),
    raw50: () => raw(50),
    store1: () => measure(1, cycle),
    store50: () => measure(50, cycle),
    engine50: () => measure(50, engineCycle),
    node1: () => measure(1, nodeSet),
    node50: () => measure(50, nodeSet),
  };
  const samples = Object.fromEntries(Object.keys(contenders).map((name) => [name, []]));
  for (let round = 0; round < rounds; round++) {
    for (const [name, measureOnce] of Object.entries(contenders)) samples[name].push(await measureOnce());
  }
  const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
  const { raw1, raw50, store1, store50, engine50, node1, node50 } = Object.fromEntries(
    Object.entries(samples).map(([name, values]) => [name, median(values)]),
  );
  client.disconnect();

  const results = [
    { name: 'raw SET NX PX, 1 client (redis-benchmark)', opsPerSecond: raw1 },
    { name: 'raw SET NX PX, 50 clients (redis-benchmark)', opsPerSecond: raw50 },
    { name: 'redisStore claim+complete, 1 caller', opsPerSecond: store1, ratio: store1 / raw1 },
    { name: 'redisStore claim+complete, 50 callers', opsPerSecond: store50, ratio: store50 / raw50 },
    { name: 'engine begin+complete on redisStore, 50 callers', opsPerSecond: engine50, ratio: engine50 / raw50 },
    { name: 'raw SET NX PX from ioredis, 1 caller', opsPerSecond: node1 },
    { name: 'raw SET NX PX from ioredis, 50 callers', opsPerSecond: node50 },
    { name: 'redisStore claim+complete vs ioredis SET NX PX, 1 caller', opsPerSecond: store1, ratio: store1 / node1 },
    {
      name: 'redisStore claim+complete vs ioredis SET NX PX, 50 callers',
      opsPerSecond: store50,
      ratio: store50 / node50,
    },
  ];
  for (const row of results) {
    const ratio = row.ratio === undefined ? '' : `  ratio ${row.ratio.toFixed(2)}`;
    console.log(`${row.name.padEnd(60)} ${String(row.opsPerSecond).padStart(8)}/s${ratio}`);
  }
  const note =
    'Ratios are store cycles/s over raw SET NX PX ops/s at the same concurrency: first against redis-benchmark (C, 1 or 50 connections), ' +
    'then against the same SET NX PX sent through the same ioredis connection (auto-pipelined), which isolates the store from the client. ' +
    'Medians of interleaved rounds; one redis-server without persistence, started by the bench. One cycle is two round trips, so 0.5 is the ceiling; the target is >= 0.40.';
  console.log(JSON.stringify({ benchmark: 'Redis store: claim+complete vs raw SET NX PX', results, note }));
} finally {
  stopServer();
}
