// Scenario 3: the store is cut under load. Two workers reach the store through a TCP proxy; clients
// keep sending charges with fresh keys; the proxy cuts every store connection and refuses new ones
// for 2 s (10 s with IDEM_CHAOS=1), then restores. While it is down only 201 and 503 + Retry-After
// come back, never a 500 and never later than the storeTimeout plus a margin; after the restore the
// service is whole again; and every key the clients then retry to success has exactly one completed
// record and its effect (at most one extra for a write whose completion the cut swallowed, without
// transactional mode; exactly one with it).
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTcpProxy, type TcpProxy } from '../../src/tcp-proxy.js';
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
} from './support.js';

const available = { redis: await redisAvailable(), postgres: await postgresAvailable() };
const runs = (kind: BackendKind) => (kind === 'redis' ? available.redis : available.postgres);
const storeTimeoutMs = 1000;
// Time for the worker to notice, answer and for the answer to cross a loaded 2-core box.
const marginMs = 1500;
const outageMs = chaos ? 10_000 : 2000;
const clients = 8;

interface Sent extends Answer {
  key: string;
  at: number;
}

for (const kind of backendKinds) {
  describe.runIf(runs(kind))(`store cut under load on ${kind}`, () => {
    let backend: Backend;
    let group: Workers;
    let proxy: TcpProxy;

    beforeAll(async () => {
      backend = await createBackend(kind, 'cut');
      proxy = await createTcpProxy({ target: backend.target });
      group = await startChargeWorkers(
        backend,
        2,
        { LEASE_MS: '500', STORE_TIMEOUT_MS: String(storeTimeoutMs) },
        backend.via(proxy.port),
      );
    });

    afterAll(async () => {
      await group?.close();
      await proxy?.close();
      await backend?.close();
    });

    it(`only 201 and 503 + Retry-After while down ${outageMs} ms, no 500, bounded latency, full service after`, async () => {
      const sent: Sent[] = [];
      const start = performance.now();
      const cutAt = 700;
      const restoreAt = cutAt + outageMs;
      const endAt = restoreAt + 1500;
      let cutDone = false;
      let restored = false;
      const schedule = (async () => {
        await pause(cutAt);
        proxy.cut();
        cutDone = true;
        await pause(outageMs);
        proxy.restore();
        restored = true;
      })();

      await Promise.all(
        Array.from({ length: clients }, async (_, client) => {
          let n = 0;
          while (performance.now() - start < endAt) {
            const key = randomUUID();
            const at = performance.now() - start;
            const worker = group.workers[(client + n++) % 2]!;
            const answer = await charge(worker.url, key, { timeoutMs: 2 * storeTimeoutMs + marginMs + 2000 });
            sent.push({ ...answer, key, at });
            // A client that got 503 backs off briefly, as Retry-After asks (shortened for the test).
            if (answer.status !== 201) await pause(50);
          }
        }),
      );
      await schedule;
      expect(cutDone && restored).toBe(true);

      const statuses = new Map<number, number>();
      for (const answer of sent) statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1);
      // Fresh keys only: nothing but a success or "store unavailable".
      expect([...statuses.keys()].filter((status) => status !== 201 && status !== 503)).toEqual([]);
      for (const answer of sent.filter((a) => a.status === 503)) {
        expect(answer.headers.get('retry-after')).toMatch(/^\d+$/);
        expect(answer.headers.get('content-type')).toMatch(/problem\+json|json/);
      }
      const slowest = Math.max(...sent.map((a) => a.ms));
      // A slow claim, then a completion that times out: two calls, each bounded by storeTimeout (the
      // release after a failed completion runs in the background).
      expect(slowest).toBeLessThan(2 * storeTimeoutMs + marginMs);
      const during = sent.filter((a) => a.at >= cutAt && a.at + a.ms <= restoreAt);
      expect(during.some((a) => a.status === 503)).toBe(true);
      // Full service once the store is back: everything sent from 500 ms after the restore succeeds.
      const after = sent.filter((a) => a.at >= restoreAt + 500);
      expect(after.length).toBeGreaterThan(0);
      expect(after.every((a) => a.status === 201)).toBe(true);

      // Clients retry every key that got 503 until it succeeds: the cut lost nothing.
      const retried = sent.filter((a) => a.status !== 201);
      let retryConflicts = 0;
      for (const answer of retried) {
        let last: Answer;
        const deadline = Date.now() + 10_000;
        do {
          last = await charge(group.workers[0]!.url, answer.key);
          if (last.status === 409) retryConflicts++;
          if (last.status !== 201) await pause(100);
        } while (last.status !== 201 && Date.now() < deadline);
        expect(last.status).toBe(201);
      }

      // No effect without a record, and no key executed more than the mode allows.
      const effects = await backend.allEffects();
      let extra = 0;
      for (const answer of sent) {
        const count = effects.get(answer.key) ?? 0;
        expect(count).toBeGreaterThanOrEqual(1);
        if (backend.transactional) expect(count).toBe(1);
        else expect(count).toBeLessThanOrEqual(2);
        extra += count - 1;
      }
      // A record for every effect. Without transactional mode there is one window this cannot
      // close: the handler's write landed, then the cut made the completion fail. The engine then
      // serves the handler's answer (the effect did happen: a 503 would make the client run it
      // again) and the key is released. Such a key is "acknowledged without a record": its client
      // holds the 201, but a retry of it would execute again. In transactional mode the write and
      // the record commit together, so there are none.
      const unrecorded: Sent[] = [];
      for (const answer of sent) if ((await backend.record(answer.key))?.state !== 'completed') unrecorded.push(answer);
      if (backend.transactional) expect(unrecorded).toEqual([]);
      for (const answer of unrecorded) {
        expect(answer.status).toBe(201);
        expect(effects.get(answer.key)).toBe(1);
        expect(answer.at).toBeLessThan(restoreAt);
      }
      expect(effects.size).toBe(sent.length);

      figures(`store-cut ${kind}`, {
        outageMs,
        requests: sent.length,
        duringOutage: during.length,
        statuses: Object.fromEntries(statuses),
        slowestMs: Math.round(slowest),
        retriedKeys: retried.length,
        retryConflicts,
        effects: [...effects.values()].reduce((a, b) => a + b, 0),
        extraExecutions: extra,
        acknowledgedWithoutRecord: unrecorded.length,
        lost: 0,
      });
    });
  });
}
