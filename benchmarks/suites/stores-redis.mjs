// @idem/redis claim+complete cycles per second beside the raw `SET NX PX` rate that redis-benchmark
// gets from the same Redis in the same rounds, at 1 and 50 concurrent callers; and the same SET NX PX
// sent through the same ioredis connection, which isolates the store's cost from the client's.
//
// The suite starts its own redis-server on a free loopback port without persistence (the setup of
// research/perf-limits.md), so no other work on the shared Redis gets in the way and both sides
// measure one server. One cycle is two round trips (claim, then the completion script), so the
// issue's target is a ratio of at least 0.40 against raw SET NX PX at 50 callers.
import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { promisify } from 'node:util';
import { runGroup } from '../lib/rounds.mjs';

const run = promisify(execFile);

/** redis-benchmark SET NX PX at 50 clients on research/perf-limits.md's idle box: ops/s, median of its runs. */
export const referenceRedisNx = 74_184;

/** Contender names, shared with the targets. */
export const redisRow = {
  raw: (clients) => `redis-benchmark SET NX PX, ${clients} client${clients === 1 ? '' : 's'}`,
  store: (callers) => `redisStore claim+complete, ${callers} caller${callers === 1 ? '' : 's'}`,
  storeNodeRedis: (callers) => `redisStore on node-redis claim+complete, ${callers} callers`,
  engine: 'engine begin+complete on redisStore, 50 callers',
  node: (callers) => `ioredis SET NX PX, ${callers} caller${callers === 1 ? '' : 's'}`,
};

const freePort = () =>
  new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });

async function hasCommand(command) {
  try {
    await run(command, ['--version']);
    return true;
  } catch {
    return false;
  }
}

/**
 * The Redis store suite (needs redis-server and redis-benchmark on the PATH).
 *
 * @example
 * const { groups } = await storesRedisSuite.run(settings, context);
 */
export const storesRedisSuite = {
  id: 'stores-redis',
  title: 'Redis store: claim+complete vs raw SET NX PX',
  async run(settings, context) {
    for (const command of ['redis-server', 'redis-benchmark']) {
      if (!(await hasCommand(command)))
        return { groups: [], notMeasured: [{ scenario: this.title, reason: `${command} is not installed` }] };
    }
    const { createIdempotency } = await import('@idem/core');
    const { redisStore } = await import('@idem/redis');
    const { Redis } = await import('ioredis');
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
    process.once('exit', stopServer);
    try {
      const client = new Redis(port, '127.0.0.1', { retryStrategy: (times) => (times > 50 ? null : 20) });
      client.on('error', () => {});
      await client.ping();
      const requests = settings.quick ? 30_000 : 60_000;
      const durationMs = settings.durationSeconds * 1_000;

      // redis-benchmark: random keys, like a real claim, over `clients` connections.
      const raw = async (clients) => {
        await client.flushall();
        const { stdout } = await run('redis-benchmark', [
          ...['-h', '127.0.0.1', '-p', String(port), '-n', String(requests), '-c', String(clients)],
          ...['-r', '100000000', '--csv', 'SET', 'bench:__rand_int__', 'v', 'NX', 'PX', '86400000'],
        ]);
        const row = stdout.trim().split('\n').at(-1) ?? '';
        const rps = Number(row.split(',')[1]?.replaceAll('"', ''));
        if (!Number.isFinite(rps)) throw new Error(`could not read redis-benchmark output: ${stdout}`);
        return Math.round(rps);
      };
      // `callers` loops, each running one operation after the other, for the window.
      const measure = async (callers, operation) => {
        await client.flushall();
        for (let i = 0; i < (settings.quick ? 200 : 2_000); i++) await operation(); // warm up the JIT and the script cache
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
      // The same cycle on a node-redis client (it batches the commands of one tick into one write,
      // which ioredis does only with enableAutoPipelining): the store's cost with either client.
      const { createClient } = await import('redis');
      const nodeRedis = await createClient({ url: `redis://127.0.0.1:${port}` }).connect();
      const nodeRedisStore = redisStore({ client: nodeRedis, prefix: 'bench:idem-node-redis:' });
      const cycleOn = (target) => async () => {
        const id = randomUUID();
        const token = randomUUID();
        const claimed = await target.claim({ id, token, fingerprint: 'fp', leaseMs: 10_000 });
        if (!claimed.claimed) throw new Error('fresh id not claimed');
        if (!(await target.complete({ id, token, response, retentionMs: 86_400_000 }))) {
          throw new Error('complete refused');
        }
      };
      const nodeRedisCycle = cycleOn(nodeRedisStore);
      const cycle = async () => {
        const id = randomUUID();
        const token = randomUUID();
        const claimed = await store.claim({ id, token, fingerprint: 'fp', leaseMs: 10_000 });
        if (!claimed.claimed) throw new Error('fresh id not claimed');
        if (!(await store.complete({ id, token, response, retentionMs: 86_400_000 })))
          throw new Error('complete refused');
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
      const nodeSet = () => client.set(`bench:${randomUUID()}`, 'v', 'PX', 86_400_000, 'NX');

      const group = await runGroup(
        {
          id: 'stores-redis',
          title: 'Redis store: claim+complete cycles/s vs raw SET NX PX ops/s',
          unit: 'ops/s',
          baseline: redisRow.raw(50),
          note:
            'One redis-server without persistence, started by the suite. Ratios in the table are against redis-benchmark at 50 clients; ' +
            'the comparisons below pair each store figure with the raw figure at the same concurrency. redisStore rows run on ioredis (the target reads them) except the node-redis one. One cycle is two round trips, so 0.5 is the ceiling; the target is >= 0.40.',
          contenders: [
            { name: redisRow.raw(50), quick: true, measure: () => raw(50) },
            { name: redisRow.raw(1), measure: () => raw(1) },
            { name: redisRow.store(1), measure: () => measure(1, cycle) },
            { name: redisRow.store(50), quick: true, measure: () => measure(50, cycle) },
            { name: redisRow.storeNodeRedis(50), measure: () => measure(50, nodeRedisCycle) },
            { name: redisRow.engine, measure: () => measure(50, engineCycle) },
            { name: redisRow.node(1), measure: () => measure(1, nodeSet) },
            { name: redisRow.node(50), quick: true, measure: () => measure(50, nodeSet) },
          ],
          comparisons: [
            [redisRow.store(1), redisRow.raw(1)],
            [redisRow.store(50), redisRow.raw(50)],
            [redisRow.storeNodeRedis(50), redisRow.raw(50)],
            [redisRow.engine, redisRow.raw(50)],
            [redisRow.store(1), redisRow.node(1)],
            [redisRow.store(50), redisRow.node(50)],
          ],
        },
        settings,
        context.log,
      );
      client.disconnect();
      await nodeRedis.quit();
      return { groups: [group] };
    } finally {
      stopServer();
    }
  },
};
