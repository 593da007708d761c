// What Fastify's own parser answers to a keyed request, before the key is claimed: every such answer
// says Cache-Control: no-store, as the same refusal does on Express and Koa, whose parsers run after
// the claim (the capture adds it there).
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/fastify';
import Fastify from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import { app } from './support.js';

describe("Fastify's parser refusals of a keyed request", () => {
  let close: (() => Promise<void>) | undefined;
  afterEach(async () => {
    await close?.();
    close = undefined;
  });

  const start = async () => {
    const instance = await app({}, (routes) => {
      routes.post('/charges', async () => ({ ok: true }));
      routes.post('/typed', { schema: { body: { type: 'object', required: ['amount'] } } }, async () => ({ ok: 1 }));
      routes.post('/small', { bodyLimit: 64 }, async () => ({ ok: true }));
      routes.post('/plain', { config: { idempotency: false } }, async () => ({ ok: true }));
    });
    close = () => instance.close();
    return instance;
  };

  it.each([
    { what: '415, no parser for the type', url: '/charges', type: 'text/xml', body: '<a/>', status: 415 },
    { what: '400, malformed JSON', url: '/charges', type: 'application/json', body: '{"a":', status: 400 },
    {
      what: "413, over the route's bodyLimit",
      url: '/small',
      type: 'application/json',
      body: JSON.stringify({ a: 'x'.repeat(100) }),
      status: 413,
    },
  ])('$what: no-store, no echo, nothing claimed', async ({ url, type, body, status }) => {
    const instance = await start();
    const res = await instance.inject({
      method: 'POST',
      url,
      headers: { 'content-type': type, 'idempotency-key': 'k-1' },
      payload: body,
    });
    expect(res.statusCode).toBe(status);
    expect(res.headers['cache-control']).toBe('no-store');
    expect(res.headers['idempotency-key']).toBeUndefined();
    expect(JSON.parse(res.body)).toMatchObject({ statusCode: status });
  });

  it("a schema's 400 is no-store as well; a bad key under the parser's refusal too", async () => {
    const instance = await start();
    const invalid = await instance.inject({
      method: 'POST',
      url: '/typed',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'k-2' },
      payload: '{}',
    });
    expect(invalid.statusCode).toBe(400);
    expect(invalid.headers['cache-control']).toBe('no-store');
    const badKey = await instance.inject({
      method: 'POST',
      url: '/charges',
      headers: { 'content-type': 'text/xml', 'idempotency-key': '' },
      payload: '<a/>',
    });
    expect(badKey.statusCode).toBe(415);
    expect(badKey.headers['cache-control']).toBe('no-store');
  });

  it('a request the plugin does not cover is left as Fastify answers it', async () => {
    const instance = await start();
    const off = await instance.inject({
      method: 'POST',
      url: '/plain',
      headers: { 'content-type': 'text/xml', 'idempotency-key': 'k-3' },
      payload: '<a/>',
    });
    expect(off.statusCode).toBe(415);
    expect(off.headers['cache-control']).toBeUndefined();
    const unkeyedGet = await instance.inject({ method: 'GET', url: '/charges', headers: { 'idempotency-key': 'k-4' } });
    expect(unkeyedGet.headers['cache-control']).toBeUndefined();
  });
});

// An app with an error handler of its own gets no-store too, whether that handler sends the error or
// a plain body of its own.
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
