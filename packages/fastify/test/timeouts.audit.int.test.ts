// Audit: what Fastify's own timeouts (`connectionTimeout`, `requestTimeout`), its 503 while closing
// (`return503OnClosing`), and a timer that answers for the handler do to the key, the stored
// outcome and the side effect, over real sockets, on the memory store and on Redis. The right
// behaviour: exactly one effect, and the key's retries end up with the handler's real outcome; a
// timeout answer written while the handler still runs must never become the key's stored outcome.

import type http from 'node:http';
import net from 'node:net';
import type { IdempotencyEvent, Store } from '@idem/core';
import { idempotency } from '@idem/fastify';
import { frameRequest, parseAnswer } from '@idem/testkit';
import Fastify, { type FastifyHttpOptions } from 'fastify';
import { describe, expect, it } from 'vitest';
import {
  gate,
  itServerTimeouts,
  post,
  retryPast409,
  type StoreBackend,
  timeoutBackends,
  until,
} from '../../core/test/support/timeouts-kit.js';

const backends: StoreBackend[] = await timeoutBackends('fastify');

interface Effects {
  started: number;
  finished: number;
}

async function start(
  store: Store,
  options: FastifyHttpOptions<http.Server> & { effects?: Effects; answerAfter?: number } = {},
  provider = gate(),
) {
  const { effects = { started: 0, finished: 0 }, answerAfter, ...server } = options;
  const events: IdempotencyEvent[] = [];
  const app = Fastify(server);
  app.addHook('onRequest', async (request) => {
    (request as { auth?: unknown }).auth = { sub: 'user-1', iss: 'https://issuer.test' };
  });
  await app.register(idempotency, { store, storeTimeout: '15s', onEvent: (event) => events.push(event) });
  app.get('/ping', async () => ({ ok: true }));
  app.post('/charges', async (_request, reply) => {
    const id = `ch_${++effects.started}`;
    // A timer of the app's own that answers 503 for a slow handler (a common Fastify snippet).
    if (answerAfter !== undefined) {
      setTimeout(() => {
        if (!reply.sent) void reply.code(503).send({ error: 'timeout' });
      }, answerAfter);
    }
    await provider.promise;
    effects.finished++;
    if (reply.sent) return reply;
    return reply.code(201).send({ id });
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address() as net.AddressInfo;
  return { app, port, url: `http://127.0.0.1:${port}/charges`, effects, provider, events };
}

const charge = Buffer.from(JSON.stringify({ amount: 100 }));

describe.each(backends)('Fastify on $name: server timeouts around the plugin', (backend) => {
  const withClose = (server: Awaited<ReturnType<typeof start>>) => ({ ...server, close: () => server.app.close() });
  itServerTimeouts(backend, {
    idle: 'connectionTimeout',
    request: 'requestTimeout',
    idleApp: (store, ms) => start(store, { connectionTimeout: ms }).then(withClose),
    requestApp: (store) =>
      start(store, { requestTimeout: 400, http: { headersTimeout: 300, connectionsCheckingInterval: 50 } }).then(
        withClose,
      ),
  });

  it('the plugin registers without store I/O, well within a short pluginTimeout', async () => {
    const app = Fastify({ pluginTimeout: 200 });
    try {
      await app.register(idempotency, { store: backend.store() });
      await expect(app.ready()).resolves.toBeDefined();
    } finally {
      await app.close();
    }
  });

  it('return503OnClosing answers a retry pipelined behind the running request 503 without storing it; the other instance replays the real 201', async () => {
    const store = backend.store();
    const effects: Effects = { started: 0, finished: 0 };
    const provider = gate();
    // Two instances on one store, as behind a load balancer; the first is being shut down.
    const closing = await start(store, { effects }, provider);
    const other = await start(store, { effects }, provider);
    // server.close() reaps idle connections, so the retry that reaches a closing Fastify is one on a
    // busy connection: pipelined behind the first attempt, which still runs.
    const kept = net.connect(closing.port, '127.0.0.1');
    kept.on('error', () => undefined);
    const head = 'POST /charges HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: closing\r\n';
    const request = frameRequest(head, charge).bytes;
    const received: Buffer[] = [];
    kept.on('data', (chunk: Buffer) => received.push(chunk));
    const ended = new Promise<void>((resolve) => kept.once('close', () => resolve()));
    let arrived = 0;
    closing.app.server.on('request', () => arrived++);
    try {
      kept.write(request);
      await until(() => effects.started === 1);
      const closed = closing.app.close();
      kept.write(request);
      // Only once the closing server has the retry: the first answer goes out with Connection: close.
      await until(() => arrived === 2);
      provider.open();
      await ended;
      await closed;
      const bytes = Buffer.concat(received);
      const second = bytes.indexOf('HTTP/1.1', 1);
      expect(parseAnswer(bytes.subarray(0, second)).status).toBe(201);
      expect(parseAnswer(bytes.subarray(second)).status).toBe(503);
      expect(effects.started).toBe(1);
      // The 503 was the closing server's, never the key's: the other instance replays the charge.
      const elsewhere = await retryPast409(other.url, 'closing');
      expect(elsewhere.status).toBe(201);
      expect(elsewhere.headers['idempotent-replayed']).toBe('true');
      expect(effects.started).toBe(1);
    } finally {
      kept.destroy();
      provider.open();
      await closing.app.close();
      await other.app.close();
    }
  });

  // Was wrong, and stays a documented limit: a timer of the app's that answers 503 through the reply
  // while the handler runs writes on the response the capture watches, so the 503 is settled as the
  // key's outcome (stored under the default policy) and replayed for the retention, though the
  // handler then made its effect (under 'stripe' or 'success', released: the retry runs it again).
  // The decided fix (hold the key while the handler's promise is pending, then keep it with
  // `response_not_replayable`) cannot tell this send from the handler's own: an async handler that
  // answers `return reply.code(201).send(x)` also ends the response while its promise is pending,
  // and that promise then waits on the reply having gone out (`reply.then`), which the capture
  // holds back until the outcome is stored; nothing in Fastify says who called `reply.send`.
  // Treating every such end as a timeout's would store `response_not_replayable` for Fastify's
  // most common handler style. Decided: the timer says so, `request.idempotency.answeringForHandler()`
  // before it sends (testkit's answering-for-handler.int.test.ts); this unsaid timer stays the limit
  // docs/guides/fastify.md names.
  it.fails('a timer answering 503 for the handler: the retry gets 409, then the real 201', async () => {
    const server = await start(backend.store(), { answerAfter: 300 });
    try {
      expect((await post(server.url, 'timer-503')).status).toBe(503);
      const during = await post(server.url, 'timer-503');
      server.provider.open();
      await until(() => server.effects.finished === 1);
      const retry = await retryPast409(server.url, 'timer-503');
      expect(server.effects.started).toBe(1);
      expect(during.status).toBe(409);
      expect(retry.status).toBe(201);
    } finally {
      server.provider.open();
      await server.app.close();
    }
  });
});
