import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { idempotency, type RouteIdempotencyOptions } from '@idem/fastify';
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify';
import { describe, expect, it } from 'vitest';
import { captureWarnings } from '../../core/test/support/warnings.js';
import { app } from './support.js';

// The plugin over a real socket, in front of a POST /charges that answers the amount it parsed (a
// bigint as its digits) and counts its runs; `before` adds hooks or parsers ahead of the plugin.
async function listening(before?: (app: FastifyInstance) => void, options: FastifyServerOptions = {}) {
  const instance = Fastify(options);
  before?.(instance);
  await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
  let runs = 0;
  instance.post('/charges', async (request) => {
    const amount = (request.body as { amount: number | bigint }).amount;
    return { amount: typeof amount === 'bigint' ? amount.toString() : amount, run: ++runs };
  });
  await instance.listen({ port: 0, host: '127.0.0.1' });
  const { port } = instance.server.address() as AddressInfo;
  return { instance, port, runs: () => runs };
}

// POST /charges over a socket, with a Content-Length, or `chunked` (a stream with no length, which
// the plugin reads itself rather than leaving it to Fastify's parser).
const sendRaw = (port: number, key: string, body: string, chunked: boolean) =>
  new Promise<{ status: number; replayed: string | undefined; body: string }>((resolve, reject) => {
    const headers: Record<string, string> = { 'content-type': 'application/json', 'idempotency-key': key };
    if (!chunked) headers['content-length'] = String(Buffer.byteLength(body));
    const req = request({ host: '127.0.0.1', port, method: 'POST', path: '/charges', headers }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        text += chunk;
      });
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, replayed: res.headers['idempotent-replayed'] as string, body: text }),
      );
    });
    req.on('error', reject);
    if (chunked) for (const part of [body.slice(0, 3), body.slice(3)]) req.write(part);
    else req.write(body);
    req.end();
  });

const post = (instance: FastifyInstance, url: string, key?: string, payload: unknown = { amount: 1 }) =>
  instance.inject({
    method: 'POST',
    url,
    payload: payload as object,
    headers: key === undefined ? {} : { 'idempotency-key': key },
  });

describe('@idem/fastify specifics', () => {
  it('a root instance and an encapsulated one on one route: the first governs, the second steps aside and warns once', async () => {
    const store = memoryStore();
    const inner: IdempotencyEvent[] = [];
    let runs = 0;
    const instance = await app({ store }, (root) => {
      void root.register(async (child) => {
        await child.register(idempotency, {
          store,
          scope: () => 'tenant-1',
          retention: '48h',
          onEvent: (event) => inner.push(event),
        });
        child.post('/charges', async (_request, reply) => reply.code(201).send({ id: `ch_${++runs}` }));
      });
    });
    const warnings = captureWarnings();
    try {
      // Before, the second instance claimed the key the first one held: 409 for every first request.
      expect((await post(instance, '/charges', 'stacked-1')).statusCode).toBe(201);
      const again = await post(instance, '/charges', 'stacked-1');
      expect(again.statusCode).toBe(201);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect((await post(instance, '/charges', 'stacked-2')).statusCode).toBe(201);
    } finally {
      warnings.stop();
      await instance.close();
    }
    expect(runs).toBe(2);
    expect(inner).toEqual([]);
    await new Promise((resolve) => setImmediate(resolve));
    expect(warnings.withCode('IDEM_STACKED')).toHaveLength(1);
  });

  it('the instance that steps aside enforces none of its settings: its maxBodyBytes gives no 413', async () => {
    const instance = await app({}, (root) => {
      void root.register(async (child) => {
        await child.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1', maxBodyBytes: 10 });
        child.post('/charges', async (_request, reply) => reply.code(201).send({ ok: true }));
      });
    });
    const warnings = captureWarnings();
    try {
      const reply = await post(instance, '/charges', 'stacked-body', { note: 'x'.repeat(100) });
      expect(reply.statusCode).toBe(201);
    } finally {
      warnings.stop();
      await instance.close();
    }
  });

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

  it("a route's own retention, outcome policy and body limit apply to that route only, on the plugin's store", async () => {
    let t = Date.parse('2026-01-01T00:00:00Z');
    const store = memoryStore({ now: () => t });
    const runs = { kept: 0, plain: 0, picky: 0, failing: 0 };
    const instance = await app({ store, now: () => t }, (a) => {
      a.post('/kept', { config: { idempotency: { retention: '7d' } } }, async () => ({ run: ++runs.kept }));
      a.post('/plain', async () => ({ run: ++runs.plain }));
      a.post('/picky', { config: { idempotency: { storeOutcome: 'success' } } }, async (_request, reply) => {
        runs.picky++;
        return reply.code(500).send({ error: 'flaky' });
      });
      a.post('/failing', async (_request, reply) => {
        runs.failing++;
        return reply.code(500).send({ error: 'flaky' });
      });
      a.post('/small', { config: { idempotency: { maxBodyBytes: 16 } } }, async () => ({ ok: true }));
    });
    try {
      for (const url of ['/kept', '/plain', '/picky', '/failing']) {
        await post(instance, url, `k${url}`);
        await post(instance, url, `k${url}`);
      }
      // The plugin's 'all' stores the 500; the route's 'success' releases it, so the retry ran.
      expect(runs.failing).toBe(1);
      expect(runs.picky).toBe(2);
      // Two days on: the plugin's 24 h are over, the route's 7 days are not.
      t += 2 * 24 * 3600_000;
      expect((await post(instance, '/plain', 'k/plain')).json()).toEqual({ run: 2 });
      const kept = await post(instance, '/kept', 'k/kept');
      expect(kept.headers['idempotent-replayed']).toBe('true');
      expect(kept.json()).toEqual({ run: 1 });
      // The route's limit, not the plugin's 1 MiB.
      expect((await post(instance, '/small', 'big', { note: 'x'.repeat(32) })).statusCode).toBe(413);
      expect((await post(instance, '/plain', 'big', { note: 'x'.repeat(32) })).statusCode).toBe(200);
    } finally {
      await instance.close();
    }
  });

  it('refuses a bad per-route setting when the route is added: a typo, a plugin-only option, a bad value', async () => {
    const cases: Array<[unknown, RegExp]> = [
      [{ retension: '7d' }, /config\.idempotency\.retension is not a per-route setting/],
      [{ store: memoryStore() }, /config\.idempotency\.store is not a per-route setting/],
      [{ retention: 'soon' }, /retention/],
      [{ retention: '1h' }, /acknowledgeShortRetention/],
      ['yes', /config\.idempotency must be false or an object/],
      [{ required: 'no' }, /config\.idempotency\.required must be a boolean/],
      [{ mintKeys: 'false' }, /config\.idempotency\.mintKeys must be a boolean/],
      [{ scope: 'tenant' }, /config\.idempotency\.scope must be a function/],
    ];
    for (const [setting, message] of cases) {
      const instance = Fastify();
      await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
      expect(() =>
        instance.post('/x', { config: { idempotency: setting as RouteIdempotencyOptions } }, async () => ({})),
      ).toThrow(message);
      await instance.close();
    }
  });

  it('a route added before the plugin with bad settings: one warning, then a plain 500, never the handler', async () => {
    const instance = Fastify();
    let runs = 0;
    const setting = { retension: '7d' } as RouteIdempotencyOptions;
    instance.post('/early', { config: { idempotency: setting } }, async () => ({ run: ++runs }));
    await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
    await instance.ready();
    const warnings = captureWarnings();
    try {
      for (const key of ['e-1', 'e-1', 'e-2']) {
        const reply = await post(instance, '/early', key);
        expect(reply.statusCode).toBe(500);
        expect(reply.body).not.toContain('retension');
      }
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      warnings.stop();
      await instance.close();
    }
    expect(runs).toBe(0);
    const refused = warnings.withCode('IDEM_ROUTE_SETTINGS');
    expect(refused).toHaveLength(1);
    expect(refused[0]?.message).toContain('config.idempotency.retension is not a per-route setting');
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
      const { instance, port, runs } = await listening((app) => {
        // An earlier hook that hands on a stream of its own (as a decompressing hook would).
        if (replaced) app.addHook('preParsing', async (_request, _reply, payload) => payload.pipe(new PassThrough()));
      });
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
        expect(runs()).toBe(1);
      } finally {
        await instance.close();
      }
    }
  });

  it('a JSON body sent with a length and the same body sent chunked are one request, whatever the parser', async () => {
    const bigIntParser = (app: FastifyInstance) => {
      app.removeContentTypeParser('application/json');
      app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
        try {
          const revive = (_key: string, value: unknown, context?: { source?: string }) =>
            typeof value === 'number' && !Number.isSafeInteger(value) && context?.source
              ? BigInt(context.source)
              : value;
          done(null, JSON.parse(body as string, revive));
        } catch (error) {
          done(error as Error, undefined);
        }
      });
    };
    // A parser that changes what it reads: the handler sees the currency in lower case.
    const lowerCaseParser = (app: FastifyInstance) => {
      app.removeContentTypeParser('application/json');
      app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
        try {
          const parsed = JSON.parse(body as string) as { currency?: string };
          if (typeof parsed.currency === 'string') parsed.currency = parsed.currency.toLowerCase();
          done(null, parsed);
        } catch (error) {
          done(error as Error, undefined);
        }
      });
    };
    // `retry` is the same request written otherwise; `other` is another body under the same key.
    const cases: {
      options?: FastifyServerOptions;
      before?: (app: FastifyInstance) => void;
      body: string;
      retry: string;
      other: string;
    }[] = [
      {
        body: '{"amount":7,"currency":"eur"}',
        retry: '{ "currency": "eur", "amount": 7 }',
        other: '{"amount":8,"currency":"eur"}',
      },
      // Fastify removes the key, so the parsed value is not the bytes: the plugin reads the bytes.
      // What the client sent counts, not what the parser kept: without the key it is another body.
      {
        options: { onProtoPoisoning: 'remove' },
        body: '{"amount":7,"__proto__":{"x":1}}',
        retry: '{"amount":7, "__proto__":{"x":1}}',
        other: '{"amount":7}',
      },
      {
        options: { onConstructorPoisoning: 'remove' },
        body: '{"amount":7,"constructor":{"prototype":{"x":1}}}',
        retry: '{"amount":7,"constructor":{"prototype":{"x":1}} }',
        other: '{"amount":7}',
      },
      // Fingerprinted from what the parser made of it, with a length or chunked alike (it used to
      // be the parsed value with a length and the bytes when chunked: a retry got 422).
      {
        before: lowerCaseParser,
        body: '{"amount":7,"currency":"EUR"}',
        retry: '{ "currency": "EUR", "amount": 7 }',
        other: '{"amount":7,"currency":"USD"}',
      },
      // Bigints have no JSON of their own: they fingerprint as the digits they were read from.
      {
        before: bigIntParser,
        body: '{"amount":123456789012345678901234}',
        retry: '{ "amount": 123456789012345678901234 }',
        other: '{"amount":1}',
      },
    ];
    for (const { options, before, body, retry, other } of cases) {
      const { instance, port, runs } = await listening(before, options);
      try {
        for (const [first, second] of [
          [false, true],
          [true, false],
        ] as const) {
          const key = `mixed-${first}`;
          const made = await sendRaw(port, key, body, first);
          expect(made.status, made.body).toBe(200);
          expect(made.replayed).toBeUndefined();
          const again = await sendRaw(port, key, retry, second);
          expect(again.replayed, `${retry} sent ${second ? 'chunked' : 'with a length'}`).toBe('true');
          expect(again.body).toBe(made.body);
          expect((await sendRaw(port, key, other, second)).status).toBe(422);
        }
        expect(runs()).toBe(2);
      } finally {
        await instance.close();
      }
    }
  });

  it('fingerprints the body the client sent, not what schema validation made of it (removed fields, defaults, coercion)', async () => {
    const instance = await app({}, (a) => {
      a.post(
        '/charges',
        {
          schema: {
            body: {
              type: 'object',
              additionalProperties: false,
              properties: { amount: { type: 'integer' }, currency: { type: 'string', default: 'usd' } },
              required: ['amount'],
            },
          },
        },
        async (request, reply) => reply.code(201).send(request.body),
      );
    });
    // Fastify's AJV removes `note`, fills in `currency` and turns "5" into 5 before the handler runs.
    const first = await post(instance, '/charges', 'v-1', { amount: '5', note: 'x' });
    expect(first.statusCode).toBe(201);
    expect(first.json()).toEqual({ amount: 5, currency: 'usd' });
    const same = await post(instance, '/charges', 'v-1', { note: 'x', amount: '5' });
    expect(same.headers['idempotent-replayed']).toBe('true');
    for (const changed of [{ amount: '5' }, { amount: 5, note: 'x' }, { amount: '5', note: 'x', currency: 'usd' }]) {
      expect((await post(instance, '/charges', 'v-1', changed)).statusCode).toBe(422);
    }
    // A body validation refuses is answered by Fastify and never claims the key.
    expect((await post(instance, '/charges', 'v-2', { amount: 'five' })).statusCode).toBe(400);
    expect((await post(instance, '/charges', 'v-2', { amount: 6 })).statusCode).toBe(201);
    await instance.close();
  });

  it('a JSON string body is fingerprinted as the string: "123" is not 123, with or without a body schema that coerces', async () => {
    const instance = await app({}, (a) => {
      a.post('/charges', async (request) => ({ body: request.body }));
      // AJV's coercion turns the string "123" into the number 123 before the handler runs.
      a.post('/coerced', { schema: { body: { type: 'number' } } }, async (request) => ({ body: request.body }));
    });
    const send = (url: string, key: string, payload: string) =>
      instance.inject({
        method: 'POST',
        url,
        payload,
        headers: { 'idempotency-key': key, 'content-type': 'application/json' },
      });
    for (const url of ['/charges', '/coerced']) {
      expect((await send(url, `n${url.length}`, '123')).statusCode, url).toBe(200);
      expect((await send(url, `n${url.length}`, '"123"')).statusCode, url).toBe(422);
      expect((await send(url, `s${url.length}`, '"123"')).statusCode, url).toBe(200);
      expect((await send(url, `s${url.length}`, ' "123" ')).headers['idempotent-replayed'], url).toBe('true');
    }
    expect((await send('/charges', 'o-1', '{"amount":1}')).statusCode).toBe(200);
    expect((await send('/charges', 'o-1', JSON.stringify('{"amount":1}'))).statusCode).toBe(422);
    await instance.close();
  });

  it('replays user-listed headers that Fastify hands to writeHead, and no others', async () => {
    const instance = await app({ replayHeaders: ['X-Charge-Version'] }, (a) => {
      a.post('/charges', async (_request, reply) =>
        reply.code(201).header('x-charge-version', '7').header('x-other', 'no').send({ ok: true }),
      );
    });
    expect((await post(instance, '/charges', 'headers-1')).headers['x-charge-version']).toBe('7');
    const again = await post(instance, '/charges', 'headers-1');
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.headers['x-charge-version']).toBe('7');
    expect(again.headers['x-other']).toBeUndefined();
    expect(again.headers['content-type']).toMatch(/^application\/json/);
    await instance.close();
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
