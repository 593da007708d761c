// Scenario 2: the response is lost after completion. A TCP proxy between the client and the worker
// swallows the answer (downstream blackhole): the request ran and its outcome was stored, but the
// client only sees a timeout. Its retry, with the same key, gets the stored response replayed
// byte for byte; the effect happened once.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTcpProxy, type TcpProxy } from '../../src/tcp-proxy.js';
import type { Workers } from '../../src/workers.js';
import {
  type Backend,
  type BackendKind,
  backendKinds,
  charge,
  createBackend,
  figures,
  pause,
  postgresAvailable,
  redisAvailable,
  startChargeWorkers,
  startTogether,
} from './support.js';

const available = { redis: await redisAvailable(), postgres: await postgresAvailable() };
const runs = (kind: BackendKind) => (kind === 'redis' ? available.redis : available.postgres);
// The three stores' blocks run at once (own workers, proxy, table or prefix, keys), beginning together
// once every worker has started: each mostly waits for its lost answers' client timeouts.
const together = startTogether(backendKinds.filter(runs).length);

for (const kind of backendKinds) {
  describe.runIf(runs(kind))(`response lost after completion on ${kind}`, { concurrent: true }, () => {
    let backend: Backend;
    let group: Workers;
    let proxy: TcpProxy;

    beforeAll(() =>
      together(async () => {
        backend = await createBackend(kind, 'lost');
        group = await startChargeWorkers(backend, 2, { LEASE_MS: '500' });
        const url = new URL(group.workers[0]!.url);
        proxy = await createTcpProxy({ target: { host: url.hostname, port: Number(url.port) } });
      }),
    );

    afterAll(async () => {
      await proxy?.close();
      await group?.close();
      await backend?.close();
    });

    it.sequential('the retry gets the replay of the lost answer; one effect', async () => {
      const rounds = 3;
      let replays = 0;
      for (let round = 0; round < rounds; round++) {
        const key = randomUUID();
        proxy.blackhole('downstream');
        const lost = await charge(`http://127.0.0.1:${proxy.port}`, key, { timeoutMs: 1500 });
        expect(lost.status).toBe(0); // the client never saw an answer

        // The worker finished and stored its outcome all the same.
        const deadline = Date.now() + 5000;
        while ((await backend.record(key))?.state !== 'completed' && Date.now() < deadline) await pause(25);
        expect((await backend.record(key))?.state).toBe('completed');

        proxy.restore();
        // Retry through the same path, and through the other worker: both replay the first answer.
        const again = await charge(`http://127.0.0.1:${proxy.port}`, key);
        const elsewhere = await charge(group.workers[1]!.url, key);
        for (const answer of [again, elsewhere]) {
          expect(answer.status).toBe(201);
          expect(answer.headers.get('idempotent-replayed')).toBe('true');
          expect(answer.body).toBe(again.body);
          replays++;
        }
        expect(JSON.parse(again.body)).toMatchObject({ key, worker: 0 });
        expect(await backend.effects(key)).toBe(1);
      }
      figures(`response-lost ${kind}`, { requests: rounds, answersLost: rounds, replays, effectsPerKey: 1 });
    });
  });
}
