import { memoryStore, type Store, StoreUnavailableError } from '@idem/core';
import { transactionalMemoryStore } from '@idem/testkit';
import type { FastifyInstance } from 'fastify';
import { describe, expect, it } from 'vitest';
import { app } from './support.js';

const send = (instance: FastifyInstance, method: 'POST' | 'DELETE', url: string, key?: string, payload: unknown = {}) =>
  instance.inject({
    method,
    url,
    payload: payload as object,
    headers: key === undefined ? {} : { 'idempotency-key': key },
  });

describe('@idem/fastify: per-route settings over the plugin options', () => {
  it("a route's required: true holds under a plugin with required: false", async () => {
    let runs = 0;
    const instance = await app({ required: false }, (a) => {
      a.post('/charges', { config: { idempotency: { required: true } } }, async () => ({ run: ++runs }));
      a.post('/notes', async () => ({ run: ++runs }));
    });
    try {
      const refused = await send(instance, 'POST', '/charges');
      expect(refused.statusCode).toBe(400);
      expect(refused.json()).toMatchObject({ code: 'key_missing' });
      expect((await send(instance, 'POST', '/notes')).statusCode).toBe(200);
      expect(runs).toBe(1);
    } finally {
      await instance.close();
    }
  });

  it("a route's mintKeys: true mints a key under a plugin that neither requires nor mints one", async () => {
    let runs = 0;
    const instance = await app({ required: false }, (a) => {
      a.post('/charges', { config: { idempotency: { mintKeys: true } } }, async (_request, reply) =>
        reply.code(201).send({ run: ++runs }),
      );
    });
    try {
      const first = await send(instance, 'POST', '/charges');
      expect(first.statusCode).toBe(201);
      const key = first.headers['idempotency-key'];
      expect(typeof key).toBe('string');
      const retry = await send(instance, 'POST', '/charges', String(key));
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(1);
    } finally {
      await instance.close();
    }
  });
});

describe("@idem/fastify: a route's storeUnavailable (anchors case 14)", () => {
  // A store down at claim time, as a network store is when it refuses the connection.
  const down = (store: Store): Store => ({
    ...store,
    claim: () =>
      Promise.reject(new StoreUnavailableError('Redis claim failed', { cause: new Error('connect ECONNREFUSED') })),
  });

  it("a route's storeUnavailable: 'fail-open' runs it unprotected; the plugin's other routes stay fail-closed", async () => {
    let runs = 0;
    const instance = await app({ store: down(memoryStore()) }, (a) => {
      a.post('/charges', { config: { idempotency: { storeUnavailable: 'fail-open' } } }, async (request, reply) =>
        reply.code(201).send({ run: ++runs, context: request.idempotency !== undefined }),
      );
      a.post('/refunds', async (_request, reply) => reply.code(201).send({ run: ++runs }));
    });
    try {
      const open = await send(instance, 'POST', '/charges', 'k-1');
      expect(open.statusCode).toBe(201);
      expect(open.json()).toEqual({ run: 1, context: false });
      expect(open.headers['idempotency-key']).toBe('k-1');
      expect(open.headers['idempotent-replayed']).toBeUndefined();
      const closed = await send(instance, 'POST', '/refunds', 'k-1');
      expect([closed.statusCode, closed.json().code]).toEqual([503, 'store_unavailable']);
      expect(runs).toBe(1);
    } finally {
      await instance.close();
    }
  });

  // Was wrong: under fail-open the key was echoed on Fastify's reply only, which a hijacked reply
  // (server-sent events, raw writes) never sends: such a response went out without it. An executing
  // request's echo is put on the raw response too, for that reason.
  it("fail-open echoes the client's key on a hijacked reply too (server-sent events, raw writes)", async () => {
    const instance = await app({ store: down(memoryStore()), storeUnavailable: 'fail-open' }, (a) => {
      a.post('/events', async (_request, reply) => {
        reply.hijack();
        reply.raw.writeHead(200, { 'content-type': 'text/event-stream' });
        reply.raw.end('data: done\n\n');
      });
    });
    try {
      const sent = await send(instance, 'POST', '/events', 'k-sse');
      expect(sent.statusCode).toBe(200);
      expect(sent.body).toBe('data: done\n\n');
      expect(sent.headers['idempotency-key']).toBe('k-sse');
    } finally {
      await instance.close();
    }
  });

  it("a route's storeUnavailable is refused when the route is added: an unknown value, or fail-open under transactional", async () => {
    await expect(
      app({}, (a) => {
        a.post('/charges', { config: { idempotency: { storeUnavailable: 'open' as never } } }, async () => ({}));
      }),
    ).rejects.toThrow(/storeUnavailable must be 'fail-closed' or 'fail-open'/);
    await expect(
      app({ store: transactionalMemoryStore(), transactional: true }, (a) => {
        a.post('/charges', { config: { idempotency: { storeUnavailable: 'fail-open' } } }, async () => ({}));
      }),
    ).rejects.toThrow(/cannot be used with transactional: true/);
  });
});

describe('@idem/fastify: what is decided before the body is read', () => {
  it('a request of a method that is not covered is never read: no 413 for its body, whatever its key', async () => {
    let runs = 0;
    const instance = await app({ maxBodyBytes: 16 }, (a) => {
      a.delete('/charges/:id', async () => ({ run: ++runs }));
    });
    try {
      const reply = await send(instance, 'DELETE', '/charges/1', 'k-1', { note: 'x'.repeat(100) });
      expect(reply.statusCode).toBe(200);
      expect(runs).toBe(1);
    } finally {
      await instance.close();
    }
  });

  it('a key refused on its own is answered 400 before the body is read, even a body over the limit', async () => {
    const big = { note: 'x'.repeat(100) };
    const strict = await app({ maxBodyBytes: 16, strictKeys: true }, (a) => {
      a.post('/charges', async () => ({ ok: true }));
    });
    const perRoute = await app({ maxBodyBytes: 16, required: false }, (a) => {
      a.post('/charges', { config: { idempotency: { required: true } } }, async () => ({ ok: true }));
    });
    try {
      // An unquoted key where only sf-strings are taken.
      const unquoted = await send(strict, 'POST', '/charges', 'k-1', big);
      expect([unquoted.statusCode, unquoted.json().code]).toEqual([400, 'key_invalid']);
      // No key where the route requires one.
      const missing = await send(perRoute, 'POST', '/charges', undefined, big);
      expect([missing.statusCode, missing.json().code]).toEqual([400, 'key_missing']);
    } finally {
      await strict.close();
      await perRoute.close();
    }
  });
});
