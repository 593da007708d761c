import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { type FastifyIdempotencyOptions, idempotency } from '@idem/fastify';
import Fastify, { type FastifyInstance } from 'fastify';
import { describe, expect, it } from 'vitest';

async function app(options: Partial<FastifyIdempotencyOptions>, routes: (app: FastifyInstance) => void) {
  const instance = Fastify();
  await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1', ...options });
  routes(instance);
  await instance.ready();
  return instance;
}

const post = (instance: FastifyInstance, url: string, key?: string, payload: unknown = { amount: 1 }) =>
  instance.inject({
    method: 'POST',
    url,
    payload: payload as object,
    headers: key === undefined ? {} : { 'idempotency-key': key },
  });

describe('@idem/fastify specifics', () => {
  it('a route opts out with config.idempotency = false', async () => {
    let runs = 0;
    const instance = await app({}, (a) => {
      a.post('/webhooks', { config: { idempotency: false } }, async () => ({ run: ++runs }));
    });
    expect((await post(instance, '/webhooks')).statusCode).toBe(200);
    expect((await post(instance, '/webhooks', 'k')).json()).toEqual({ run: 2 });
    expect((await post(instance, '/webhooks', 'k')).headers['idempotent-replayed']).toBeUndefined();
    await instance.close();
  });

  it('per-route required: false and mintKeys override the plugin options', async () => {
    const instance = await app({}, (a) => {
      a.post('/optional', { config: { idempotency: { required: false } } }, async () => ({ ok: true }));
      a.post('/minted', { config: { idempotency: { mintKeys: true } } }, async (_request, reply) =>
        reply.code(201).send({ ok: true }),
      );
      a.post('/strict', async () => ({ ok: true }));
    });
    expect((await post(instance, '/optional')).statusCode).toBe(200);
    expect((await post(instance, '/strict')).statusCode).toBe(400);
    const minted = await post(instance, '/minted');
    expect(minted.statusCode).toBe(201);
    const key = String(minted.headers['idempotency-key']);
    expect((await post(instance, '/minted', key)).headers['idempotent-replayed']).toBe('true');
    await instance.close();
  });

  it('the operation is the route template, and request.idempotency carries the key', async () => {
    const events: IdempotencyEvent[] = [];
    const instance = await app({ onEvent: (event) => events.push(event) }, (a) => {
      a.post('/charges/:id/refunds', async (request) => ({
        key: request.idempotency?.key,
        minted: request.idempotency?.minted,
      }));
    });
    const first = await post(instance, '/charges/ch_1/refunds', '"r-1"');
    expect(first.json()).toEqual({ key: 'r-1', minted: false });
    expect(events.find((event) => event.type === 'claim')?.operation).toBe('POST /charges/:id/refunds');
    // Same template, other path: the same record, so a different request.
    expect((await post(instance, '/charges/ch_2/refunds', '"r-1"')).statusCode).toBe(422);
    await instance.close();
  });

  it("knows when the handler threw: policy 'stripe' releases the key instead of storing the 500", async () => {
    let runs = 0;
    const instance = await app({ storeOutcome: 'stripe' }, (a) => {
      a.post('/boom', async () => {
        runs++;
        throw new Error('failed');
      });
    });
    expect((await post(instance, '/boom', 'b-1')).statusCode).toBe(500);
    const again = await post(instance, '/boom', 'b-1');
    expect(again.statusCode).toBe(500);
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    expect(runs).toBe(2);
    await instance.close();
  });

  it('keeps headers earlier hooks set on the reply (CORS) on replays and problems', async () => {
    const instance = Fastify();
    instance.addHook('onRequest', async (_request, reply) => {
      reply.header('access-control-allow-origin', 'https://app.example');
    });
    await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
    instance.post('/charges', async (_request, reply) => reply.code(201).send({ ok: true }));
    await instance.ready();
    await post(instance, '/charges', 'cors-1');
    const replay = await post(instance, '/charges', 'cors-1');
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.headers['access-control-allow-origin']).toBe('https://app.example');
    const problem = await post(instance, '/charges');
    expect(problem.statusCode).toBe(400);
    expect(problem.headers['access-control-allow-origin']).toBe('https://app.example');
    await instance.close();
  });

  it('over a real socket: reads the request itself, or the stream an earlier preParsing hook put in its place', async () => {
    for (const replaced of [false, true]) {
      const instance = Fastify();
      // An earlier hook that hands on a stream of its own (as a decompressing hook would).
      if (replaced)
        instance.addHook('preParsing', async (_request, _reply, payload) => payload.pipe(new PassThrough()));
      await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
      let runs = 0;
      instance.post('/charges', async (request) => ({
        amount: (request.body as { amount: number }).amount,
        run: ++runs,
      }));
      await instance.listen({ port: 0, host: '127.0.0.1' });
      const { port } = instance.server.address() as AddressInfo;
      const send = (key: string, body: string) =>
        fetch(`http://127.0.0.1:${port}/charges`, {
          method: 'POST',
          body,
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
        });
      try {
        const first = await send('real-1', '{"amount":7}');
        expect(await first.json()).toEqual({ amount: 7, run: 1 });
        const again = await send('real-1', '{ "amount": 7 }');
        expect(again.headers.get('idempotent-replayed')).toBe('true');
        expect(await again.json()).toEqual({ amount: 7, run: 1 });
        expect((await send('real-1', '{"amount":8}')).status).toBe(422);
        expect(runs).toBe(1);
      } finally {
        await instance.close();
      }
    }
  });

  it('leaves unmatched routes (404) alone', async () => {
    const instance = await app({}, () => undefined);
    const missing = await post(instance, '/nowhere', 'nf-1');
    expect(missing.statusCode).toBe(404);
    expect(missing.headers['idempotency-key']).toBeUndefined();
    expect((await post(instance, '/nowhere')).statusCode).toBe(404);
    await instance.close();
  });
});
