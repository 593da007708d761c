// Scenario 1: a worker SIGKILLed at three points of a request (inside the handler, after the handler's
// write and before completion, after completion and before the response). Another worker's retry is
// refused with 409 while the dead worker's lease lives, runs once that lease (500 ms, by the store's
// clock) is over, and the key never stays wedged. Effects: without transactional mode at most one
// extra execution (the write that happened before the kill); with it exactly one in total.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Workers } from '../../src/workers.js';
import {
  type Backend,
  type BackendKind,
  backendKinds,
  charge,
  createBackend,
  figures,
  postgresAvailable,
  redisAvailable,
  retryUntilSettled,
  startChargeWorkers,
  startTogether,
} from './support.js';

const leaseMs = 500;
const available = { redis: await redisAvailable(), postgres: await postgresAvailable() };
const runs = (kind: BackendKind) => (kind === 'redis' ? available.redis : available.postgres);
// The three stores' blocks run at once (own workers, table or prefix, keys), beginning together once
// every worker has started; within a block the tests stay in order, as each kills and restarts worker 0.
const together = startTogether(backendKinds.filter(runs).length);

// What each kill point must leave behind, once the retry has settled: effects counted in the store's
// database, and whether the first retry is already the replay.
const expectations: Record<
  'inside-handler' | 'after-write' | 'after-complete',
  { effects: (transactional: boolean) => number; replayAtOnce: boolean }
> = {
  'inside-handler': { effects: () => 1, replayAtOnce: false },
  // The write before the kill is the one extra execution; a transaction takes it back.
  'after-write': { effects: (transactional) => (transactional ? 1 : 2), replayAtOnce: false },
  'after-complete': { effects: () => 1, replayAtOnce: true },
};

for (const kind of backendKinds) {
  describe.runIf(runs(kind))(`SIGKILL mid-request on ${kind}`, { concurrent: true }, () => {
    let backend: Backend;
    let group: Workers;

    beforeAll(() =>
      together(async () => {
        backend = await createBackend(kind, 'crash');
        group = await startChargeWorkers(backend, 2, { LEASE_MS: String(leaseMs) });
      }),
    );

    afterAll(async () => {
      await group?.close();
      await backend?.close();
    });

    for (const [killAt, expected] of Object.entries(expectations)) {
      it.sequential(`killed ${killAt}: never wedged, the retry settles within a lease, ${expected.effects(kind === 'postgres-tx')} effect(s) in total`, async () => {
        const key = randomUUID();
        const first = await charge(group.workers[0]!.url, key, { killAt });
        expect(first.status).toBe(0); // the connection died with the worker
        expect(await group.workers[0]!.exited).toBe('SIGKILL');

        const immediate = await charge(group.workers[1]!.url, key);
        if (expected.replayAtOnce) {
          // The outcome was stored before the kill: the retry is the replay, no lease to wait for.
          expect(immediate.status).toBe(201);
          expect(immediate.headers.get('idempotent-replayed')).toBe('true');
        } else {
          // The dead worker's lease still lives: refused, not run a second time alongside.
          expect(immediate.status).toBe(409);
          expect(immediate.headers.get('retry-after')).toMatch(/^\d+$/);
        }

        const settled = await retryUntilSettled(group.workers[1]!.url, key, 10 * leaseMs);
        expect(settled.answer.status).toBe(201);
        // Free again after about one lease, never after the retention (an hour here).
        expect(settled.waitedMs).toBeLessThan(8 * leaseMs);
        const final = await charge(group.workers[1]!.url, key);
        expect(final.status).toBe(201);
        expect(final.headers.get('idempotent-replayed')).toBe('true');
        expect(final.body).toBe(settled.answer.body);
        expect((await backend.record(key))?.state).toBe('completed');
        const effects = await backend.effects(key);
        expect(effects).toBe(expected.effects(backend.transactional));
        figures(`crash ${kind} ${killAt}`, {
          recoveredAfterMs: Math.round(settled.waitedMs),
          conflictsWhileLeased: settled.conflicts,
          effects,
        });

        await group.restart(0);
      });
    }
  });
}
