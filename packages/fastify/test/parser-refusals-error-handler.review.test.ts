// Fastify's parser refusals of a keyed request say Cache-Control: no-store (parser-refusals.test.ts),
// as the same refusals do on Express and Koa. An app with an error handler of its own gets it too,
// whether that handler sends the error or a plain body of its own.
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/fastify';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';

describe("Fastify's parser refusals of a keyed request, under the app's own error handler", () => {
  it.each([
    { what: 'a handler that sends a plain object', send: 'object' },
    { what: 'a handler that sends the error', send: 'error' },
  ])('$what: no-store on the 400 of malformed JSON', async ({ send }) => {
    const app = Fastify();
    await app.register(idempotency, { store: memoryStore(), scope: () => 'user-1' });
    app.setErrorHandler((error: { statusCode?: number }, _request, reply) => {
      const status = error.statusCode ?? 500;
      if (send === 'error') return reply.code(status).send(error);
      return reply.code(status).send({ problem: 'bad request' });
    });
    app.post('/charges', async () => ({ ok: true }));
    try {
      const res = await app.inject({
        method: 'POST',
        url: '/charges',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'k-1' },
        payload: '{"a":',
      });
      expect(res.statusCode).toBe(400);
      expect(res.headers['cache-control']).toBe('no-store');
    } finally {
      await app.close();
    }
  });
});
