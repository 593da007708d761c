// Edges of the Fastify glue (idempotency.ts, auth.ts) that mutation testing showed no other test pinned.
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable, type Transform } from 'node:stream';
import { createGunzip, gzipSync } from 'node:zlib';
import { memoryStore } from '@idem/core';
import { idempotency, type RouteIdempotencyOptions } from '@idem/fastify';
import { createInternalTokenIssuer, policy, principalFromClaims } from '@idem/guard';
import Fastify, { type FastifyInstance } from 'fastify';
import { describe, expect, it, vi } from 'vitest';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from '../../guard/test/support/tokens.js';
import { authorize, authPlugin, guard } from '../src/auth.js';
import { app } from './support.js';

const post = (
  instance: FastifyInstance,
  url: string,
  key: string | undefined,
  payload: unknown = { amount: 1 },
  headers: Record<string, string> = {},
  method: 'POST' | 'PUT' = 'POST',
) =>
  instance.inject({
    method,
    url,
    payload: payload as object,
    headers: { ...headers, ...(key === undefined ? {} : { 'idempotency-key': key }) },
  });

describe('@idem/fastify idempotency, beyond the scenario table', () => {
  it("a route with only hook settings (required, mintKeys) keeps the plugin's other options: its mismatchStatus", async () => {
    const instance = await app({ mismatchStatus: 400 }, (a) => {
      a.post('/optional', { config: { idempotency: { required: false } } }, async () => ({ ok: true }));
    });
    try {
      expect((await post(instance, '/optional', 'm-1', { amount: 1 })).statusCode).toBe(200);
      const other = await post(instance, '/optional', 'm-1', { amount: 2 });
      expect(other.statusCode).toBe(400);
      expect(other.json()).toMatchObject({ code: 'idempotency_error' });
    } finally {
      await instance.close();
    }
  });

  it('release() on a route with an instance of its own (its own retention): the 503 is not stored, the retry runs', async () => {
    let runs = 0;
    const instance = await app({}, (a) => {
      a.post('/payouts', { config: { idempotency: { retention: '48h' } } }, async (request, reply) => {
        runs++;
        if (runs === 1) {
          request.idempotency?.release();
          return reply.code(503).send({ error: 'try_later' });
        }
        return reply.code(201).send({ run: runs });
      });
    });
    try {
      expect((await post(instance, '/payouts', 'p-1')).statusCode).toBe(503);
      const retry = await post(instance, '/payouts', 'p-1');
      expect([retry.statusCode, retry.headers['idempotent-replayed']]).toEqual([201, undefined]);
      expect((await post(instance, '/payouts', 'p-1')).headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(2);
    } finally {
      await instance.close();
    }
  });

  it("a route's own scope overrides the plugin's: two callers of that route never share a record", async () => {
    let runs = 0;
    const instance = await app({ scope: () => 'everyone' }, (a) => {
      a.post(
        '/mine',
        { config: { idempotency: { scope: (request) => String(request.headers['x-caller']) } } },
        async () => ({ run: ++runs }),
      );
    });
    try {
      expect((await post(instance, '/mine', 'same', { a: 1 }, { 'x-caller': 'alice' })).json()).toEqual({ run: 1 });
      const bob = await post(instance, '/mine', 'same', { a: 1 }, { 'x-caller': 'bob' });
      expect(bob.headers['idempotent-replayed']).toBeUndefined();
      expect(bob.json()).toEqual({ run: 2 });
      const alice = await post(instance, '/mine', 'same', { a: 1 }, { 'x-caller': 'alice' });
      expect(alice.headers['idempotent-replayed']).toBe('true');
    } finally {
      await instance.close();
    }
  });

  it('refuses an array as config.idempotency when the route is added', async () => {
    const instance = Fastify();
    await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
    expect(() =>
      instance.post('/x', { config: { idempotency: [] as unknown as RouteIdempotencyOptions } }, async () => ({})),
    ).toThrow(/config\.idempotency must be false or an object/);
    await instance.close();
  });

  it("a route that opts out is left to Fastify entirely: the plugin's maxBodyBytes gives no 413 there", async () => {
    let runs = 0;
    const instance = await app({ maxBodyBytes: 16 }, (a) => {
      a.post('/webhooks', { config: { idempotency: false } }, async () => ({ run: ++runs }));
    });
    try {
      const big = 'x'.repeat(64);
      // A text body, which the plugin would read itself.
      const reply = await post(instance, '/webhooks', 'k', big, { 'content-type': 'text/plain' });
      expect(reply.statusCode).toBe(200);
      expect(reply.json()).toEqual({ run: 1 });
    } finally {
      await instance.close();
    }
  });

  it('a method the plugin does not cover (PUT) is left alone even with a key: no body read, no 413', async () => {
    let runs = 0;
    const instance = await app({ maxBodyBytes: 16 }, (a) => {
      a.put('/things', async () => ({ run: ++runs }));
    });
    try {
      const big = 'x'.repeat(64);
      const reply = await post(instance, '/things', 'k', big, { 'content-type': 'text/plain' }, 'PUT');
      expect(reply.statusCode).toBe(200);
      expect(reply.json()).toEqual({ run: 1 });
    } finally {
      await instance.close();
    }
  });

  it('a JSON body one byte over maxBodyBytes with a Content-Length is 413, however short it parses to', async () => {
    let runs = 0;
    const instance = await app({ maxBodyBytes: 32 }, (a) => {
      a.post('/charges', async () => ({ run: ++runs }));
    });
    try {
      const exact = `{"amount":1}${' '.repeat(32 - 12)}`;
      expect(Buffer.byteLength(exact)).toBe(32);
      const atLimit = await post(instance, '/charges', 'limit-1', exact, { 'content-type': 'application/json' });
      expect(atLimit.statusCode).toBe(200);
      const over = await post(instance, '/charges', 'limit-2', `${exact} `, { 'content-type': 'application/json' });
      expect(over.statusCode).toBe(413);
      expect(over.headers['content-type']).toBe('application/problem+json');
      expect(runs).toBe(1);
    } finally {
      await instance.close();
    }
  });

  it('behind a decompressing preParsing hook, maxBodyBytes applies to the decoded body, not the declared length', async () => {
    let runs = 0;
    const instance = Fastify();
    instance.addHook('preParsing', async (request, _reply, payload) => {
      if (request.headers['content-encoding'] !== 'gzip') return payload;
      return payload.pipe(createGunzip());
    });
    await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1', maxBodyBytes: 1024 });
    instance.post('/charges', async () => ({ run: ++runs }));
    try {
      const bomb = gzipSync(JSON.stringify({ note: 'x'.repeat(64 * 1024) }));
      expect(bomb.length).toBeLessThan(1024);
      const reply = await instance.inject({
        method: 'POST',
        url: '/charges',
        payload: bomb,
        headers: { 'content-type': 'application/json', 'content-encoding': 'gzip', 'idempotency-key': 'gz-1' },
      });
      expect(reply.statusCode).toBe(413);
      expect(runs).toBe(0);
    } finally {
      await instance.close();
    }
  });

  it('behind a decompressing hook that reports the encoded length, a gzipped body with a Content-Length runs and replays', async () => {
    let runs = 0;
    const instance = Fastify();
    // Fastify's own advice for a stream a preParsing hook hands on: `receivedEncodedLength` says how
    // many bytes came off the wire, which Fastify checks against Content-Length.
    instance.addHook('preParsing', async (request, _reply, payload) => {
      if (request.headers['content-encoding'] !== 'gzip') return payload;
      const decoded: Transform & { receivedEncodedLength?: number } = createGunzip();
      decoded.receivedEncodedLength = 0;
      payload.on('data', (chunk: Buffer) => {
        decoded.receivedEncodedLength = (decoded.receivedEncodedLength ?? 0) + chunk.length;
      });
      return payload.pipe(decoded);
    });
    await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
    instance.post('/charges', async (request) => ({ got: request.body, run: ++runs }));
    try {
      const send = () =>
        instance.inject({
          method: 'POST',
          url: '/charges',
          payload: gzipSync(JSON.stringify({ amount: 5, note: 'x'.repeat(200) })),
          headers: { 'content-type': 'application/json', 'content-encoding': 'gzip', 'idempotency-key': 'gz-ok' },
        });
      const first = await send();
      expect(first.statusCode).toBe(200);
      expect(first.json()).toMatchObject({ got: { amount: 5 }, run: 1 });
      const again = await send();
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(1);
    } finally {
      await instance.close();
    }
  });

  it("cookies an earlier hook set stay separate Set-Cookie headers on problems and replays, as on Fastify's own replies", async () => {
    const instance = Fastify();
    instance.addHook('onRequest', async (_request, reply) => {
      reply.header('set-cookie', ['session=s1; HttpOnly', 'theme=dark']);
    });
    await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
    instance.post('/charges', async () => ({ ok: true }));
    try {
      const cookies = ['session=s1; HttpOnly', 'theme=dark'];
      const handled = await post(instance, '/charges', 'cookie-1');
      expect(handled.headers['set-cookie']).toEqual(cookies);
      const replay = await post(instance, '/charges', 'cookie-1');
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.headers['set-cookie']).toEqual(cookies);
      const problem = await post(instance, '/charges', undefined);
      expect(problem.statusCode).toBe(400);
      expect(problem.headers['set-cookie']).toEqual(cookies);
    } finally {
      await instance.close();
    }
  });

  it('a non-JSON body is fingerprinted by its bytes, not by what a custom parser made of them', async () => {
    let runs = 0;
    const instance = Fastify();
    // A parser that normalises: "Hello" and "hello" parse to the same value.
    instance.addContentTypeParser('text/plain', { parseAs: 'string' }, (_request, body, done) =>
      done(null, String(body).toLowerCase()),
    );
    await instance.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1' });
    instance.post('/notes', async (request) => ({ note: request.body, run: ++runs }));
    try {
      const send = (text: string) => post(instance, '/notes', 'note-1', text, { 'content-type': 'text/plain' });
      expect((await send('Hello')).json()).toEqual({ note: 'hello', run: 1 });
      expect((await send('Hello')).headers['idempotent-replayed']).toBe('true');
      expect((await send('hello')).statusCode).toBe(422);
      expect(runs).toBe(1);
    } finally {
      await instance.close();
    }
  });

  it('a scope function that throws is a 500, never a hung request nor the handler', async () => {
    let runs = 0;
    const instance = await app(
      {
        scope: () => {
          throw new Error('tenant lookup failed');
        },
      },
      (a) => {
        a.post('/charges', async () => ({ run: ++runs }));
      },
    );
    try {
      expect((await post(instance, '/charges', 'scope-throws')).statusCode).toBe(500);
      expect(runs).toBe(0);
    } finally {
      await instance.close();
    }
  });

  it('an injected clock that fails while a request begins is a 500, never a hung request nor the handler', async () => {
    let broken = false;
    let runs = 0;
    const instance = await app(
      {
        now: () => {
          if (broken) throw new Error('clock failed');
          return Date.now();
        },
      },
      (a) => {
        a.post('/charges', async () => ({ run: ++runs }));
      },
    );
    try {
      broken = true;
      expect((await post(instance, '/charges', 'clock-1')).statusCode).toBe(500);
      expect(runs).toBe(0);
    } finally {
      broken = false;
      await instance.close();
    }
  });
});

describe('@idem/fastify guard glue, beyond the scenario table', () => {
  const clock = manualClock();
  const bearer = (claims: Record<string, unknown> = {}) => ({ authorization: `Bearer ${makeToken({ claims })}` });

  it('authorize() hands the route parameters to policies: one tenant reaches only its own orders', async () => {
    const instance = Fastify();
    await instance.register(authPlugin);
    let runs = 0;
    const verify = guard({ audience: AUDIENCE, now: clock.now, issuers: [{ issuer: ISSUER, secret: SECRET }] });
    instance.get(
      '/tenants/:tenant/orders',
      {
        onRequest: [verify],
        preHandler: [
          authorize(
            policy((principal, request) => (request.params as { tenant?: string }).tenant === principal.claims.tenant),
          ),
        ],
      },
      async () => ({ run: ++runs }),
    );
    try {
      const own = await instance.inject({
        method: 'GET',
        url: '/tenants/t1/orders',
        headers: bearer({ tenant: 't1' }),
      });
      expect(own.statusCode).toBe(200);
      const other = await instance.inject({
        method: 'GET',
        url: '/tenants/t2/orders',
        headers: bearer({ tenant: 't1' }),
      });
      expect(other.statusCode).toBe(403);
      expect(runs).toBe(1);
    } finally {
      await instance.close();
    }
  });

  it('authorize() after something other than guard() set request.auth: 401 problem, never a 500 nor the handler', async () => {
    const instance = Fastify();
    await instance.register(authPlugin);
    let runs = 0;
    instance.get(
      '/orders',
      {
        onRequest: [
          async (request) => {
            request.auth = principalFromClaims({ sub: 'forged', iss: 'nobody' });
          },
          authorize(),
        ],
      },
      async () => ({ run: ++runs }),
    );
    try {
      const answer = await instance.inject({ method: 'GET', url: '/orders' });
      expect(answer.statusCode).toBe(401);
      expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(runs).toBe(0);
    } finally {
      await instance.close();
    }
  });

  it('authPlugin refuses guard and internal together', async () => {
    const instance = Fastify();
    const internalIssuer = createInternalTokenIssuer({ issuer: 'https://gateway.example', now: clock.now });
    await expect(
      instance
        .register(authPlugin, {
          guard: { audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] },
          internal: { issuer: 'https://gateway.example', audience: 'orders', jwks: internalIssuer.jwks() },
        })
        .ready(),
    ).rejects.toThrow('authPlugin takes guard or internal, not both');
    await instance.close();
  });

  it('authPlugin with internal verifies the internal token of every request of the instance', async () => {
    const internalIssuer = createInternalTokenIssuer({ issuer: 'https://gateway.example', now: clock.now });
    const instance = Fastify();
    await instance.register(authPlugin, {
      internal: { issuer: 'https://gateway.example', audience: 'orders', jwks: internalIssuer.jwks(), now: clock.now },
    });
    instance.get('/x', async (request) => ({ sub: request.auth?.sub }));
    try {
      expect((await instance.inject({ method: 'GET', url: '/x' })).statusCode).toBe(401);
      // An edge token is no internal token.
      expect((await instance.inject({ method: 'GET', url: '/x', headers: bearer() })).statusCode).toBe(401);
      const principal = principalFromClaims({ sub: 'user-1', iss: ISSUER }, { issuer: ISSUER });
      const token = await internalIssuer.mint(principal, { audience: 'orders' });
      const allowed = await instance.inject({ method: 'GET', url: '/x', headers: { 'idem-internal-token': token } });
      expect(allowed.statusCode).toBe(200);
      expect(allowed.json()).toEqual({ sub: 'user-1' });
    } finally {
      await instance.close();
    }
  });

  it('reply.send(stream) whose stream fails after its first chunk: the answer is cut, the key kept, and the retry gets 500 response_not_replayable', async () => {
    const events: string[] = [];
    let runs = 0;
    const instance = await app({ onEvent: (event) => events.push(event.type) }, (routes) => {
      routes.post('/export', async (_request, reply) => {
        runs++;
        let reads = 0;
        const body = new Readable({
          read() {
            if (reads++ === 0) this.push('the first chunk\n');
            else setImmediate(() => this.destroy(new Error('EIO (injected)')));
          },
        });
        return reply.type('text/plain').send(body);
      });
    });
    try {
      await instance.listen({ port: 0, host: '127.0.0.1' });
      const { port } = instance.server.address() as AddressInfo;
      const send = () =>
        new Promise<{ status: number; code?: string; replayed?: string } | 'cut'>((resolve) => {
          const req = httpRequest({ host: '127.0.0.1', port, path: '/export', method: 'POST' }, (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (chunk: Buffer) => chunks.push(chunk));
            res.on('error', () => resolve('cut'));
            res.on('aborted', () => resolve('cut'));
            res.on('end', () =>
              resolve({
                status: res.statusCode ?? 0,
                code: (JSON.parse(Buffer.concat(chunks).toString()) as { code?: string }).code,
                replayed: res.headers['idempotent-replayed'] as string | undefined,
              }),
            );
          });
          req.on('error', () => resolve('cut'));
          req.setHeader('idempotency-key', 'export-1');
          req.end();
        });
      expect(await send()).toBe('cut');
      await vi.waitFor(() => expect(events).toContain('complete'));
      expect(await send()).toEqual({ status: 500, code: 'response_not_replayable', replayed: 'true' });
      expect(runs).toBe(1);
    } finally {
      await instance.close();
    }
  });
});
