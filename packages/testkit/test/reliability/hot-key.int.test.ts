// Scenario 6: a hot key. About 1,000 requests per second on one key (2 s; 10 s with IDEM_CHAOS=1),
// spread over two workers, while the first execution takes 200 ms. Exactly one execution; every
// other answer is 409 + Retry-After (while it runs) or the replay (after), or, when the shared box
// cannot keep up, 503 + Retry-After for a store call the worker gave up on after waiting its bound
// (load shed); store operations stay within one per request (each worker's counting wrapper around
// its store; for Redis the server's INFO commandstats delta is reported too); latency does not
// collapse.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Workers } from '../../src/workers.js';
import {
  type Answer,
  type Backend,
  type BackendKind,
  backendKinds,
  chaos,
  charge,
  createBackend,
  figures,
  pause,
  postgresAvailable,
  redisAvailable,
  startChargeWorkers,
  stats,
} from './support.js';

const available = { redis: await redisAvailable(), postgres: await postgresAvailable() };
const runs = (kind: BackendKind) => (kind === 'redis' ? available.redis : available.postgres);
const durationMs = chaos ? 10_000 : 2000;
const perSecond = 1000;
const tickMs = 10;
// The least a worker waits on its store before it sheds a request with 503: its PostgreSQL pool's
// connectionTimeoutMillis (fixtures/charge-worker.ts); storeTimeout (2 s) bounds every store call.
const shedAfterMs = 500;

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!;
const totalOps = (ops: Record<string, number>) => Object.values(ops).reduce((a, b) => a + b, 0);

for (const kind of backendKinds) {
  describe.runIf(runs(kind))(`hot key on ${kind}`, () => {
    let backend: Backend;
    let group: Workers;

    beforeAll(async () => {
      backend = await createBackend(kind, 'hot');
      group = await startChargeWorkers(backend, 2, { LEASE_MS: '1000', HANDLER_MS: '200', STORE_TIMEOUT_MS: '2000' });
    });

    afterAll(async () => {
      await group?.close();
      await backend?.close();
    });

    it(`~${perSecond} req/s on one key for ${durationMs} ms: one execution, bounded store operations`, async () => {
      const key = randomUUID();
      const before = await Promise.all(group.workers.map((w) => stats(w.url)));
      const commandsBefore = kind === 'redis' ? await backend.commandCount() : 0;

      // Open loop: a batch every tick, whether or not earlier answers came back, as real clients do.
      const pending: Promise<Answer>[] = [];
      const start = performance.now();
      let sentCount = 0;
      while (performance.now() - start < durationMs) {
        const due = Math.floor(((performance.now() - start) / 1000) * perSecond);
        for (; sentCount < due; sentCount++) pending.push(charge(group.workers[sentCount % 2]!.url, key));
        await pause(tickMs);
      }
      const answers = await Promise.all(pending);
      const elapsed = performance.now() - start;

      const after = await Promise.all(group.workers.map((w) => stats(w.url)));
      const commands = kind === 'redis' ? (await backend.commandCount()) - commandsBefore : undefined;

      const statuses = new Map<number, number>();
      for (const answer of answers) statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1);
      const executed = answers.filter((a) => a.status === 201 && a.headers.get('idempotent-replayed') !== 'true');
      const replays = answers.filter((a) => a.headers.get('idempotent-replayed') === 'true');
      const ops = after.map((s, i) => totalOps(s.ops) - totalOps(before[i]!.ops)).reduce((a, b) => a + b, 0);
      const latencies = answers.map((a) => a.ms).sort((a, b) => a - b);
      const p50 = percentile(latencies, 0.5);
      const p99 = percentile(latencies, 0.99);
      const effects = await backend.effects(key);
      const shed = answers.filter((a) => a.status === 503);
      const storeErrors = after
        .map((s, i) => (s.events['store-error'] ?? 0) - (before[i]!.events['store-error'] ?? 0))
        .reduce((a, b) => a + b, 0);
      figures(`hot-key ${kind}`, {
        durationMs: Math.round(elapsed),
        requests: answers.length,
        ratePerSecond: Math.round((answers.length / elapsed) * 1000),
        statuses: Object.fromEntries(statuses),
        replays: replays.length,
        executions: executed.length,
        effects,
        storeOps: ops,
        redisCommands: commands,
        p50Ms: Math.round(p50),
        p99Ms: Math.round(p99),
        storeErrors,
        fastestShedMs: shed.length > 0 ? Math.round(Math.min(...shed.map((a) => a.ms))) : undefined,
      });

      // 201 (the run and its replays) and 409 (while it runs). On a saturated box a request whose
      // store call waits past the worker's bound is shed with 503 + Retry-After instead of queueing
      // without end, and never a 500. How many are shed depends on the box's load (one run on a
      // loaded 2-core box shed 409 on PostgreSQL, more than the quarter once asserted here), not on
      // the store, so their number is not bounded here; what is asserted is that each is the store's bound at work: a store error the
      // worker reported (claims are not shared between requests, so one each), answered no sooner
      // than the least the worker waits on its store. A 503 for any other reason (a refusal at once,
      // a handler run that failed) breaks one of these.
      expect([...statuses.keys()].filter((status) => status !== 201 && status !== 409 && status !== 503)).toEqual([]);
      expect(shed.length).toBeLessThanOrEqual(storeErrors);
      for (const answer of shed) {
        expect(answer.headers.get('retry-after')).toMatch(/^\d+$/);
        expect(answer.ms).toBeGreaterThanOrEqual(shedAfterMs);
      }
      // And the storm ends in service: the key replays at once.
      const settled = await charge(group.workers[0]!.url, key);
      expect(settled.headers.get('idempotent-replayed')).toBe('true');
      expect(executed).toHaveLength(1);
      for (const replay of replays) expect(replay.body).toBe(executed[0]!.body);
      for (const conflict of answers.filter((a) => a.status === 409))
        expect(conflict.headers.get('retry-after')).toMatch(/^\d+$/);
      expect(effects).toBe(1);

      // At most one store operation per request (a claim; a replay or a 409 is answered from it),
      // plus the winner's complete and a few lease renewals. In-process repeats of a key that is in
      // flight here cost none at all.
      expect(ops).toBeLessThanOrEqual(answers.length + 20);
      // Redis's own INFO commandstats delta is reported with the figures but not asserted: it counts
      // every client of this shared server (other test files included), so only the per-process
      // count above is exact.
      // Not a benchmark: a bound far above normal that a collapse (queueing without end) would cross.
      expect(p99).toBeLessThan(4000);
    });
  });
}
