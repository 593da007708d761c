// Scenario 4: the store is slow. Worker 0 reaches its store through a TCP proxy that adds latency;
// worker 1 has a clean path and keeps retrying the same key.
//  - Latency below the lease (200 ms each way, lease 1.5 s, handler 4 s): the heartbeat renews the
//    lease through the slow link; worker 1 gets 409 the whole time; one execution.
//  - Latency beyond the lease (600 ms each way, lease 400 ms), switched on once the handler runs:
//    renewals cannot arrive in time, so the store lets worker 1 take over and execute. The fencing
//    token then refuses worker 0's late completion: the stored outcome is worker 1's and is never
//    overwritten. In transactional mode worker 0's write is rolled back with it (one effect); without
//    it, worker 0's write already happened (at most one extra execution).
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTcpProxy, type TcpProxy } from '../../src/tcp-proxy.js';
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
  stats,
} from './support.js';

const available = { redis: await redisAvailable(), postgres: await postgresAvailable() };
const runs = (kind: BackendKind) => (kind === 'redis' ? available.redis : available.postgres);
// The six scenarios (three stores, two latencies) run at once: each has its own proxy, workers and
// key, and each mostly waits on its handler and leases. They begin together, after every worker
// has started.
const together = startTogether(2 * backendKinds.filter(runs).length);

/** Retries `key` on `url` every 50 ms while `running` is pending; resolves to every answer. */
async function pester(url: string, key: string, running: Promise<unknown>): Promise<Answer[]> {
  let done = false;
  void running.finally(() => {
    done = true;
  });
  const answers: Answer[] = [];
  while (!done) {
    answers.push(await charge(url, key));
    await pause(50);
  }
  return answers;
}

for (const kind of backendKinds) {
  describe.runIf(runs(kind))(`store slow on ${kind}`, { concurrent: true }, () => {
    let backend: Backend;

    beforeAll(async () => {
      backend = await createBackend(kind, 'slow');
    });
    afterAll(async () => {
      await backend?.close();
    });

    describe('latency below the lease', () => {
      let group: Workers;
      let proxy: TcpProxy;
      beforeAll(() =>
        together(async () => {
          proxy = await createTcpProxy({ target: backend.target });
          const direct = backend.env();
          group = await startChargeWorkers(
            backend,
            2,
            (i) => ({
              LEASE_MS: '1500',
              STORE_TIMEOUT_MS: '3000',
              // A PostgreSQL connection opened through the delayed proxy needs a 400 ms round trip
              // before its first query: with the pool's default 500 ms wait for one, a store call
              // needing a second connection (a renewal while another holds the first) can fail on a
              // busy box, and twice under load the first client got 503. Not this scenario's fault.
              POOL_CONNECT_TIMEOUT_MS: '3000',
              HANDLER_MS: i === 0 ? '4000' : '0',
              ...(i === 1 ? { STORE_URL: direct.STORE_URL as string } : {}),
            }),
            backend.via(proxy.port),
          );
        }),
      );
      afterAll(async () => {
        await group?.close();
        await proxy?.close();
      });

      it('the heartbeat renews through the slow link: only 409 for the other worker, one execution', async () => {
        const key = randomUUID();
        proxy.delay(200);
        const first = charge(group.workers[0]!.url, key);
        // Let the claim land before the other worker starts asking.
        const deadline = Date.now() + 5000;
        while ((await backend.record(key)) === undefined && Date.now() < deadline) await pause(20);
        const meanwhile = await pester(group.workers[1]!.url, key, first);
        const answer = await first;
        proxy.restore();
        expect(answer.status).toBe(201);
        expect(answer.headers.get('idempotent-replayed')).toBeNull();
        expect(meanwhile.length).toBeGreaterThan(5);
        // Every answer while the first ran: 409; possibly a replay at the very end. Never a run.
        for (const other of meanwhile) {
          expect([409, 201]).toContain(other.status);
          if (other.status === 201) expect(other.headers.get('idempotent-replayed')).toBe('true');
        }
        expect(await backend.effects(key)).toBe(1);
        const renewals = (await stats(group.workers[0]!.url)).ops.renew ?? 0;
        expect(renewals).toBeGreaterThanOrEqual(2);
        figures(`store-slow-renew ${kind}`, {
          latencyEachWayMs: 200,
          leaseMs: 1500,
          handlerMs: 4000,
          renewals,
          retriesRefused: meanwhile.filter((a) => a.status === 409).length,
          effects: 1,
        });
      });
    });

    describe('latency beyond the lease', () => {
      let group: Workers;
      let proxy: TcpProxy;
      beforeAll(() =>
        together(async () => {
          proxy = await createTcpProxy({ target: backend.target });
          const direct = backend.env();
          group = await startChargeWorkers(
            backend,
            2,
            (i) => ({
              LEASE_MS: '400',
              STORE_TIMEOUT_MS: '5000',
              HANDLER_MS: i === 0 ? '1500' : '0',
              ...(i === 1 ? { STORE_URL: direct.STORE_URL as string } : {}),
            }),
            backend.via(proxy.port),
          );
        }),
      );
      afterAll(async () => {
        await group?.close();
        await proxy?.close();
      });

      it('the lease ends at the store, the other worker takes over, the late completion is fenced', async () => {
        const key = randomUUID();
        const first = charge(group.workers[0]!.url, key, { timeoutMs: 30_000 });
        const deadline = Date.now() + 5000;
        while ((await backend.record(key)) === undefined && Date.now() < deadline) await pause(20);
        expect((await backend.record(key))?.state).toBe('in_progress');
        proxy.delay(600);

        const takeover = await retryUntilSettled(group.workers[1]!.url, key, 10_000);
        expect(takeover.answer.status).toBe(201);
        expect(JSON.parse(takeover.answer.body)).toMatchObject({ worker: 1 });
        const late = await first;
        proxy.restore();

        // Whatever worker 0 answered its own client, the record is worker 1's and stays so.
        const replay = await charge(group.workers[1]!.url, key);
        expect(replay.headers.get('idempotent-replayed')).toBe('true');
        expect(replay.body).toBe(takeover.answer.body);
        const lost = (await stats(group.workers[0]!.url)).events['lease-lost'] ?? 0;
        expect(lost).toBeGreaterThanOrEqual(1);
        const effects = await backend.effects(key);
        if (backend.transactional) {
          expect(effects).toBe(1);
          // Its transaction could not commit: the client is told to retry, and the retry replays.
          expect(late.status).toBe(503);
        } else {
          expect(effects).toBeLessThanOrEqual(2);
        }
        figures(`store-slow-fence ${kind}`, {
          latencyEachWayMs: 600,
          leaseMs: 400,
          takeoverAfterMs: Math.round(takeover.waitedMs),
          lateFinisherStatus: late.status,
          lateCompletionRefused: lost,
          effects,
        });
      });
    });
  });
}
