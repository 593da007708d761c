// Scenario 5: clock skew of ±30 s between workers. Worker 0's engine clock (`now`, from skewedClock)
// runs 30 s fast, worker 1's 30 s slow: a full minute apart, 120 times the 500 ms lease. Leases and
// retention are durations timed by the store (Redis PX, PostgreSQL now()), so:
//  - a lease held by one worker is respected by the other (409 while the handler runs and renews);
//  - a dead worker's lease ends after about one lease for the other, neither at once (as a store on
//    the fast clock would think) nor 30 s late (as one on the slow clock would);
//  - a completed record lives its retention (60 s here) by the store's clock, whichever worker wrote it.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Workers } from '../../src/workers.js';
import {
  type Answer,
  type Backend,
  type BackendKind,
  backendKinds,
  charge,
  createBackend,
  figures,
  pause,
  postgresAvailable,
  redisAvailable,
  retryUntilSettled,
  startChargeWorkers,
  startTogether,
} from './support.js';

const available = { redis: await redisAvailable(), postgres: await postgresAvailable() };
const runs = (kind: BackendKind) => (kind === 'redis' ? available.redis : available.postgres);
// The three stores' blocks run at once (own workers, table or prefix, keys), beginning together once
// every worker has started; within a block the tests stay in order, as they kill and restart its workers.
const together = startTogether(backendKinds.filter(runs).length);
const leaseMs = 500;
const retentionMs = 60_000;
const skews = [30_000, -30_000];

for (const kind of backendKinds) {
  describe.runIf(runs(kind))(`clock skew of ±30 s on ${kind}`, { concurrent: true }, () => {
    let backend: Backend;
    let group: Workers;

    beforeAll(() =>
      together(async () => {
        backend = await createBackend(kind, 'skew');
        group = await startChargeWorkers(backend, 2, (i) => ({
          LEASE_MS: String(leaseMs),
          RETENTION_MS: String(retentionMs),
          SKEW_MS: String(skews[i]),
          HANDLER_MS: '1200',
        }));
      }),
    );
    afterAll(async () => {
      await group?.close();
      await backend?.close();
    });

    it.sequential("a live lease holds across skewed workers, and retention is the store clock's", async () => {
      const observed: Record<string, unknown> = {};
      for (const [runner, other] of [
        [0, 1],
        [1, 0],
      ] as const) {
        const key = randomUUID();
        const first = charge(group.workers[runner]!.url, key);
        while ((await backend.record(key)) === undefined) await pause(20);
        const meanwhile: Answer[] = [];
        let done = false;
        void first.finally(() => {
          done = true;
        });
        while (!done) {
          meanwhile.push(await charge(group.workers[other]!.url, key));
          await pause(50);
        }
        expect((await first).status).toBe(201);
        // The handler ran 1.2 s, more than two leases: the other worker never ran it alongside.
        for (const answer of meanwhile) {
          if (answer.status === 201) expect(answer.headers.get('idempotent-replayed')).toBe('true');
          else expect(answer.status).toBe(409);
        }
        expect(await backend.effects(key)).toBe(1);
        const replay = await charge(group.workers[other]!.url, key);
        expect(replay.headers.get('idempotent-replayed')).toBe('true');
        // Retention by the store's clock: 60 s, not 30 s nor 90 s.
        const ttl = (await backend.ttl(key)) as number;
        expect(ttl).toBeGreaterThan(retentionMs - 10_000);
        expect(ttl).toBeLessThanOrEqual(retentionMs);
        observed[`skew${skews[runner]! > 0 ? '+' : ''}${skews[runner]! / 1000}s`] = {
          refusedMeanwhile: meanwhile.filter((a) => a.status === 409).length,
          retentionLeftMs: Math.round(ttl),
        };
      }
      figures(`clock-skew-lease ${kind}`, observed);
    });

    it.sequential("a dead worker's lease ends after about one lease on the other worker's skewed clock", async () => {
      const observed: Record<string, number> = {};
      for (const [dying, survivor] of [
        [0, 1],
        [1, 0],
      ] as const) {
        const key = randomUUID();
        const lost = await charge(group.workers[dying]!.url, key, { killAt: 'inside-handler' });
        expect(lost.status).toBe(0);
        const immediate = await charge(group.workers[survivor]!.url, key);
        expect(immediate.status).toBe(409);
        const settled = await retryUntilSettled(group.workers[survivor]!.url, key, 20 * leaseMs);
        expect(settled.answer.status).toBe(201);
        expect(settled.waitedMs).toBeLessThan(8 * leaseMs);
        expect(await backend.effects(key)).toBe(1);
        observed[`freedAfterMs(skew ${skews[dying]! / 1000}s died)`] = Math.round(settled.waitedMs);
        await group.restart(dying);
      }
      figures(`clock-skew-crash ${kind}`, observed);
    });
  });
}
