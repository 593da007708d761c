// Audit of docs/errors.md: each code's "when it happens" and "what to do" provoked for real (servers
// on port 0 with the adapters, real Redis and PostgreSQL, injected clocks), where no other test
// already does it with the same check. The status, the headers the row names, `retryable`, and that
// following the row's advice works (the retry replays or runs once). One describe per section.
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createClient, isRequestFailedError } from '@idem/client';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { guard, idempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import {
  createTcpProxy,
  databaseUrl,
  frameRequest,
  postgresAnswers,
  redisAnswers,
  redisUrl,
  sendRaw,
  serviceAvailable,
} from '@idem/testkit';
import { createReceiver, createSender, createSigner, expressWebhook } from '@idem/webhooks';
import express from 'express';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import { SignJWT } from 'jose';
import Koa from 'koa';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { gate, listen } from '../../packages/core/test/support/timeouts-kit.js';

const withRedis = serviceAvailable(`Redis at ${redisUrl()}`, await redisAnswers(), 'the errors.md audit on Redis');
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl()}`,
  await postgresAnswers(),
  'the errors.md audit on PostgreSQL',
);

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'errors.md'), 'utf8');
/** The row of the page's tables whose first cell is the code `code`. */
const row = (code: string): string => {
  const line = page.split('\n').find((text) => text.startsWith(`| \`${code}\``));
  if (line === undefined) throw new Error(`docs/errors.md has no row ${code}`);
  return line;
};

const prefix = `audit-errorsdoc:${randomUUID().slice(0, 8)}:`;

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  await Promise.all(closers.splice(0).map((close) => close()));
});

/** Serves a request listener on port 0 until the test ends. */
async function serve(listener: http.RequestListener): Promise<string> {
  const { url, close } = await listen(http.createServer(listener));
  closers.push(close);
  return url;
}
const serveExpress = (app: express.Express) => serve(app);
const serveKoa = (app: Koa) => serve(app.callback());

describe('Idempotency (IdempotencyError)', () => {
  // The fingerprint_mismatch row listed "method, route" among the differences that get 422. Was
  // wrong: the record is the caller, the operation (method and route) and the key, so the same key
  // on another method or route is another record and the request runs; only what differs within
  // one operation (the concrete path of a template, query, media type, body, a header named in
  // fingerprint.headers) gets 422.
  it('fingerprint_mismatch: within one operation a path, query, media type, body or fingerprint header gets 422; another method or route runs', async () => {
    const runs: string[] = [];
    const app = express();
    // Mounted per route: the operation is the route's template (app-wide, it is the concrete path).
    const keyed = idempotency({
      store: memoryStore(),
      scope: () => 'tenant-1',
      fingerprint: { headers: ['api-version'] },
    });
    const handler: express.RequestHandler = (req, res) => {
      runs.push(`${req.method} ${req.path}`);
      res.status(201).json({ run: runs.length });
    };
    app.post('/orders/:id', keyed, handler);
    app.patch('/orders/:id', keyed, handler);
    app.post('/refunds/:id', keyed, handler);
    const url = await serveExpress(app);
    const send = (method: string, path: string, headers: Record<string, string> = {}, body = '{"a":1}') =>
      fetch(`${url}${path}`, {
        method,
        headers: { 'idempotency-key': '"k-1"', 'content-type': 'application/json', 'api-version': '1', ...headers },
        body,
      });
    expect((await send('POST', '/orders/1')).status).toBe(201);
    for (const other of [
      () => send('POST', '/orders/2'),
      () => send('POST', '/orders/1?x=1'),
      () => send('POST', '/orders/1', { 'content-type': 'text/plain' }),
      () => send('POST', '/orders/1', {}, '{"a":2}'),
      () => send('POST', '/orders/1', { 'api-version': '2' }),
    ]) {
      const answer = await other();
      expect(answer.status).toBe(422);
      expect(await answer.json()).toMatchObject({ code: 'fingerprint_mismatch', retryable: false });
    }
    // Another method or route under the same key: its own record, so it runs.
    expect((await send('PATCH', '/orders/1')).status).toBe(201);
    expect((await send('POST', '/refunds/1')).status).toBe(201);
    expect(runs).toEqual(['POST /orders/1', 'PATCH /orders/1', 'POST /refunds/1']);
    // The row's advice: a new key for a new operation runs it.
    expect((await send('POST', '/orders/2', { 'idempotency-key': '"k-2"' })).status).toBe(201);
    expect(runs).toHaveLength(4);
    expect(row('fingerprint_mismatch')).not.toMatch(/\(method, route,/);
    expect(row('fingerprint_mismatch')).toMatch(
      /the same key on another method or route is another record, and that request runs/,
    );
  });

  // key_invalid row: "control or non-ASCII characters". Was wrong for every control character but
  // a tab: Node's HTTP parser refuses such a header line itself, with a bare 400 (Fastify's JSON
  // `Client Error`), before any middleware; only a tab inside a key and non-ASCII bytes reach the
  // middleware and get key_invalid.
  it("key_invalid: a tab or a non-ASCII byte in the key gets key_invalid; another control character gets Node's own 400", async () => {
    const app = express();
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1' }));
    app.post('/charges', (_req, res) => {
      res.status(201).end();
    });
    const port = Number(new URL(await serveExpress(app)).port);
    const send = (key: string) =>
      sendRaw(
        port,
        frameRequest(
          `POST /charges HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: text/plain\r\nIdempotency-Key: ${key}\r\n`,
          Buffer.from('x'),
        ).bytes,
      );
    for (const key of ['a\tb', '"a\tb"', 'caf\u00e9', '"caf\u00e9"']) {
      const answer = await send(key);
      expect(answer.status, JSON.stringify(key)).toBe(400);
      expect(JSON.parse(answer.body.toString())).toMatchObject({ code: 'key_invalid' });
    }
    for (const key of ['a\u0001b', 'a\u007fb']) {
      const answer = await send(key);
      expect(answer.status, JSON.stringify(key)).toBe(400);
      expect(answer.headers['content-type']).toBeUndefined();
    }
    expect(row('key_invalid')).toMatch(/other control characters never reach it/);
  });

  it.runIf(withRedis)(
    'store_unavailable: a store slower than storeTimeout gets 503 + Retry-After 2, retryable; the retry with the same key runs once',
    async () => {
      const target = new URL(redisUrl());
      const proxy = await createTcpProxy({ target: { host: target.hostname, port: Number(target.port || 6379) } });
      const redis = new Redis({ host: proxy.host, port: proxy.port, lazyConnect: true });
      await redis.connect();
      closers.push(async () => {
        redis.disconnect();
        await proxy.close();
      });
      let runs = 0;
      const app = new Koa();
      app.use(
        koaIdempotency({
          store: redisStore({ client: redis, prefix }),
          scope: () => 'tenant-1',
          storeTimeout: '200ms',
        }),
      );
      app.use((ctx) => {
        runs++;
        ctx.status = 201;
        ctx.body = { run: runs };
      });
      const url = await serveKoa(app);
      const send = () =>
        fetch(`${url}/charges`, { method: 'POST', headers: { 'idempotency-key': '"k-slow"' }, body: 'x' });
      proxy.blackhole();
      const refused = await send();
      expect(refused.status).toBe(503);
      expect(refused.headers.get('retry-after')).toBe('2');
      expect(await refused.json()).toMatchObject({ code: 'store_unavailable', retryable: true });
      expect(runs).toBe(0);
      // The store answers again: the connection the blackhole swallowed is dropped, ioredis reconnects.
      proxy.cut();
      proxy.restore();
      let retried = await send();
      for (let i = 0; i < 50 && retried.status === 503; i++) retried = await send();
      expect(retried.status).toBe(201);
      const again = await send();
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(runs).toBe(1);
    },
  );

  it('scope_missing: a scope function giving a number, an object or an empty string is 500, not retryable, and nothing runs', async () => {
    for (const given of [42, { id: 'u' }, '']) {
      let runs = 0;
      const app = new Koa();
      app.use(koaIdempotency({ store: memoryStore(), scope: () => given as unknown as string }));
      app.use((ctx) => {
        runs++;
        ctx.status = 201;
      });
      const url = await serveKoa(app);
      const answer = await fetch(`${url}/charges`, {
        method: 'POST',
        headers: { 'idempotency-key': '"k"' },
        body: 'x',
      });
      expect(answer.status).toBe(500);
      expect(answer.headers.get('content-type')).toBe('application/problem+json');
      expect(await answer.json()).toMatchObject({ code: 'scope_missing', retryable: false });
      expect(runs).toBe(0);
    }
  });

  // lease_lost row: "without it Express's default handler answers a bare 503 from the error's status".
  it('lease_lost on Express: with idempotencyErrors() a 503 problem with Retry-After; without it a bare 503', async () => {
    for (const withErrors of [true, false]) {
      const app = express();
      app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', lease: '300ms', maxExecution: '200ms' }));
      const entered = gate();
      app.post('/charges', async (req, res, next) => {
        const signal = req.idempotency?.signal as AbortSignal;
        entered.open();
        try {
          await new Promise((_resolve, reject) =>
            signal.addEventListener('abort', () => reject(signal.reason), { once: true }),
          );
          res.status(201).end();
        } catch (error) {
          next(error);
        }
      });
      if (withErrors) app.use(idempotencyErrors());
      const url = await serveExpress(app);
      const answer = await fetch(`${url}/charges`, {
        method: 'POST',
        headers: { 'idempotency-key': '"k-lost"' },
        body: 'x',
      });
      await entered.promise;
      expect(answer.status).toBe(503);
      if (withErrors) {
        expect(answer.headers.get('retry-after')).toBe('1');
        expect(await answer.json()).toMatchObject({ code: 'lease_lost', retryable: true });
      } else {
        expect(answer.headers.get('content-type')).not.toBe('application/problem+json');
      }
    }
  });
});

describe('Guard (GuardError)', () => {
  // token_expired: "Refresh the token, then retry the request (with the same Idempotency-Key)". The
  // guard answers before the key is claimed, so the retry with a fresh token runs the operation once,
  // and its repeat replays.
  it('token_expired: 401 invalid_token, no Retry-After, not retryable; the same key with a fresh token runs once', async () => {
    const ISS = 'https://id.example';
    const AUD = 'https://api.example';
    const secret = 'errors-audit-hs256-secret-of-32+bytes!';
    let t = Date.UTC(2026, 11, 6, 12, 0, 0);
    let runs = 0;
    const app = express();
    app.use(guard({ audience: AUD, issuers: [{ issuer: ISS, secret }], now: () => t }));
    app.use(idempotency({ store: memoryStore({ now: () => t }), now: () => t }));
    app.post('/charges', (_req, res) => {
      runs++;
      res.status(201).json({ id: `ch_${runs}` });
    });
    app.use(idempotencyErrors());
    const url = await serveExpress(app);
    const token = (iat: number) =>
      new SignJWT({ iss: ISS, aud: AUD, sub: 'user-1', iat, exp: iat + 300 })
        .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt' })
        .sign(new TextEncoder().encode(secret));
    const send = async (bearer: string) =>
      fetch(`${url}/charges`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${bearer}`,
          'idempotency-key': '"k-auth"',
          'content-type': 'application/json',
        },
        body: '{"amount":100}',
      });
    const old = await token(Math.floor(t / 1000));
    t += 10 * 60_000; // the token expired on the way
    const refused = await send(old);
    expect(refused.status).toBe(401);
    expect(refused.headers.get('www-authenticate')).toMatch(/^Bearer .*error="invalid_token"/);
    expect(refused.headers.get('retry-after')).toBeNull();
    expect(refused.headers.get('cache-control')).toBe('no-store');
    expect(await refused.json()).toMatchObject({ code: 'token_expired', retryable: false });
    expect(runs).toBe(0);
    const fresh = await token(Math.floor(t / 1000));
    expect((await send(fresh)).status).toBe(201);
    const again = await send(fresh);
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(runs).toBe(1);
  });
});

describe.runIf(withRedis)('Webhooks (WebhookError)', () => {
  const secret = `whsec_${Buffer.from('errors-audit-webhook-secret-32b!').toString('base64')}`;
  let redis: Redis;
  beforeAll(() => {
    redis = new Redis(redisUrl());
  });
  afterAll(async () => {
    await redis.quit();
  });

  // "The receiver also answers in_progress (409, Retry-After: 1 ...). Both are retried by any sender,
  // and the retry is acknowledged once." Through @idem/webhooks' own sender and a real server.
  it('in_progress: 409 with Retry-After 1 while the event is applied; the sender retries and is acknowledged once, applied once', async () => {
    const applied: string[] = [];
    const release = gate();
    const entered = gate();
    const receiver = createReceiver({
      store: redisStore({ client: redis, prefix: `${prefix}hooks:` }),
      secret,
      apply: async (event) => {
        applied.push(event.id);
        entered.open();
        await release.promise;
      },
    });
    const app = express();
    app.post('/hooks', expressWebhook(receiver));
    const url = await serveExpress(app);
    const id = `msg_${randomUUID().replaceAll('-', '')}`;
    const body = '{"type":"payment.succeeded"}';
    // A first delivery is being applied.
    const first = fetch(`${url}/hooks`, {
      method: 'POST',
      headers: { ...createSigner({ secret }).sign({ id, body, timestamp: Math.floor(Date.now() / 1000) }) },
      body,
    });
    await entered.promise;
    const attempts: Array<{ status?: number | undefined }> = [];
    const waits: number[] = [];
    const sender = createSender({
      secret,
      sleep: async (ms) => {
        waits.push(ms);
        release.open();
        await first;
      },
      onAttempt: (attempt) => attempts.push({ status: attempt.status }),
    });
    const result = await sender.send({ url: `${url}/hooks`, id, body });
    expect(attempts.map((attempt) => attempt.status)).toEqual([409, 200]);
    expect(waits[0]).toBeGreaterThanOrEqual(1_000);
    expect(result).toMatchObject({ outcome: 'delivered' });
    expect((await first).status).toBe(200);
    expect(applied).toEqual([id]);
  });

  it('apply_failed: 500, retryable; the next delivery applies the event once', async () => {
    const applied: string[] = [];
    let failNext = true;
    const receiver = createReceiver({
      store: redisStore({ client: redis, prefix: `${prefix}hooks:` }),
      secret,
      apply: (event) => {
        if (failNext) {
          failNext = false;
          throw new Error('ledger down');
        }
        applied.push(event.id);
      },
    });
    const app = express();
    app.post('/hooks', expressWebhook(receiver));
    const url = await serveExpress(app);
    const id = `msg_${randomUUID().replaceAll('-', '')}`;
    const body = '{"type":"payment.succeeded"}';
    const deliver = () =>
      fetch(`${url}/hooks`, {
        method: 'POST',
        headers: { ...createSigner({ secret }).sign({ id, body, timestamp: Math.floor(Date.now() / 1000) }) },
        body,
      });
    const failed = await deliver();
    expect(failed.status).toBe(500);
    expect(await failed.json()).toMatchObject({ code: 'apply_failed', retryable: true });
    expect((await deliver()).status).toBe(200);
    const duplicate = await deliver();
    expect(duplicate.status).toBe(200);
    expect(duplicate.headers.get('idempotent-replayed')).toBe('true');
    expect(applied).toEqual([id]);
  });
});

describe('Client (RequestFailedError)', () => {
  // "any problem+json answer that says retryable: false, such as a replayed response_not_replayable"
  // is final: the client does not repeat a 500 whose answer says it cannot succeed.
  it('a replayed response_not_replayable rejects with http_error after one attempt, body.code kept', async () => {
    let runs = 0;
    const app = express();
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', maxResponseBytes: 16 }));
    app.post('/exports', (_req, res) => {
      runs++;
      res.status(201).json({ rows: 'x'.repeat(100) });
    });
    const url = await serveExpress(app);
    const waits: number[] = [];
    const client = createClient({
      baseUrl: url,
      sleep: async (ms) => {
        waits.push(ms);
      },
    });
    const first = await client.post('/exports', {}, { idempotencyKey: 'k-export' });
    expect(first.status).toBe(201);
    const error = await client.post('/exports', {}, { idempotencyKey: 'k-export' }).catch((e: unknown) => e);
    expect(isRequestFailedError(error)).toBe(true);
    if (!isRequestFailedError(error)) return;
    expect(error.code).toBe('http_error');
    expect(error.status).toBe(500);
    expect(error.body).toMatchObject({ code: 'response_not_replayable', retryable: false });
    expect(error.key).toBe('k-export');
    expect(waits).toEqual([]);
    expect(runs).toBe(1);
  });

  // response_too_large: "Raise maxResponseBytes for that request, or read it yourself". Was
  // incomplete: the write ran (the server answered it in full), and a new call mints a new key, so
  // following the advice as written ran the operation twice. With `idempotencyKey: error.key` the
  // retry is a replay.
  it('response_too_large: the write ran; a retry with error.key and a larger limit replays it, a new call would run it again', async () => {
    let runs = 0;
    const app = express();
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1' }));
    app.post('/exports', (_req, res) => {
      runs++;
      res.status(201).json({ run: runs, rows: 'x'.repeat(2_000) });
    });
    const url = await serveExpress(app);
    const client = createClient({ baseUrl: url, maxResponseBytes: 1_000 });
    const error = await client.post('/exports', {}).catch((e: unknown) => e);
    expect(isRequestFailedError(error) && error.code).toBe('response_too_large');
    if (!isRequestFailedError(error)) return;
    expect(runs).toBe(1);
    expect(error.key).toBeDefined();
    const retried = await client.post<{ run: number }>(
      '/exports',
      {},
      { idempotencyKey: error.key as string, maxResponseBytes: 10_000 },
    );
    expect(retried.replayed).toBe(true);
    expect(retried.body.run).toBe(1);
    expect(runs).toBe(1);
    // Without the key, the same call is a new operation: it runs again.
    await client.post('/exports', {}, { maxResponseBytes: 10_000 });
    expect(runs).toBe(2);
    expect(row('response_too_large')).toMatch(/same `error\.key`/);
  });

  // in_progress row: "Wait Retry-After, retry with the same key"; the client does it, and gets the replay.
  it('in_progress: the client waits Retry-After and retries with the same key, and gets the replay; one run', async () => {
    let runs = 0;
    const release = gate();
    const app = express();
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1' }));
    const finished = gate();
    app.post('/charges', async (_req, res) => {
      runs++;
      await release.promise;
      res.status(201).json({ id: 'ch_1' });
      res.on('finish', () => finished.open());
    });
    const url = await serveExpress(app);
    const first = fetch(`${url}/charges`, {
      method: 'POST',
      headers: { 'idempotency-key': 'k-busy', 'content-type': 'application/json' },
      body: '{}',
    });
    while (runs === 0) await new Promise((resolve) => setImmediate(resolve));
    const waits: number[] = [];
    const client = createClient({
      baseUrl: url,
      sleep: async (ms) => {
        waits.push(ms);
        release.open();
        await finished.promise;
      },
    });
    const retried = await client.post<{ id: string }>('/charges', {}, { idempotencyKey: 'k-busy' });
    expect((await first).status).toBe(201);
    expect(waits[0]).toBeGreaterThanOrEqual(1_000);
    expect(retried.status).toBe(201);
    expect(retried.replayed).toBe(true);
    expect(retried.body.id).toBe('ch_1');
    expect(runs).toBe(1);
  });
});

describe.runIf(withRedis)('Stores', () => {
  let admin: Redis;
  beforeAll(() => {
    admin = new Redis(redisUrl());
  });
  afterAll(async () => {
    const keys = await admin.keys(`${prefix}*`);
    if (keys.length > 0) await admin.del(...keys);
    await admin.quit();
  });

  it('a value idem did not write under the prefix: 503 store_unavailable, store-error with the RecordFormatError', async () => {
    const storePrefix = `${prefix}foreign:`;
    const events: IdempotencyEvent[] = [];
    let runs = 0;
    const app = express();
    app.use(
      idempotency({
        store: redisStore({ client: admin, prefix: storePrefix }),
        scope: () => 'tenant-1',
        onEvent: (event) => events.push(event),
      }),
    );
    app.post('/charges', (_req, res) => {
      runs++;
      res.status(201).end();
    });
    app.use(idempotencyErrors());
    const url = await serveExpress(app);
    const send = () =>
      fetch(`${url}/charges`, { method: 'POST', headers: { 'idempotency-key': '"k-foreign"' }, body: 'x' });
    expect((await send()).status).toBe(201);
    // Another application overwrites every record under the prefix.
    const keys = await admin.keys(`${storePrefix}*`);
    expect(keys.length).toBeGreaterThan(0);
    for (const key of keys) await admin.set(key, 'not idem');
    const answer = await send();
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toBe('2');
    expect(await answer.json()).toMatchObject({ code: 'store_unavailable' });
    const failure = events.find((event) => event.type === 'store-error');
    expect(failure).toBeDefined();
    // The error as it is: a Redis that answered, not a StoreUnavailableError (fail-open stays closed).
    const error = (failure as { error?: { name?: string } }).error;
    expect(error?.name).toBe('RecordFormatError');
    expect(runs).toBe(1);
  });
});

describe.runIf(withPostgres)('Stores (PostgreSQL)', () => {
  // "any other database error ... (passed through) ... such as a missing table (run migrate()). The
  // engine still answers 503 and emits store-error with the original error": and once migrate() ran,
  // the retry with the same key runs once.
  it('a missing table: 503 store_unavailable with Retry-After, store-error with the 42P01 error itself; after migrate() the retry runs once', async () => {
    const pool = new pg.Pool({ connectionString: databaseUrl(), max: 2 });
    const table = `audit_errorsdoc_${randomUUID().slice(0, 8)}`;
    closers.push(async () => {
      await pool.query(`drop table if exists ${table}`);
      await pool.end();
    });
    const events: IdempotencyEvent[] = [];
    let runs = 0;
    const app = Fastify();
    await app.register(fastifyIdempotency, {
      store: postgresStore({ client: pool, table }),
      scope: () => 'tenant-1',
      onEvent: (event) => events.push(event),
    });
    app.post('/charges', async (_request, reply) => {
      runs++;
      return reply.code(201).send({ run: runs });
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    closers.push(() => app.close());
    const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    const send = () =>
      fetch(`${url}/charges`, {
        method: 'POST',
        headers: { 'idempotency-key': '"k-table"', 'content-type': 'application/json' },
        body: '{}',
      });
    const refused = await send();
    expect(refused.status).toBe(503);
    expect(refused.headers.get('retry-after')).toBe('2');
    expect(await refused.json()).toMatchObject({ code: 'store_unavailable', retryable: true });
    const failure = events.find((event) => event.type === 'store-error') as { error?: { code?: string } } | undefined;
    expect(failure?.error?.code).toBe('42P01');
    expect(runs).toBe(0);
    await migrate(pool, { table });
    expect((await send()).status).toBe(201);
    expect((await send()).headers.get('idempotent-replayed')).toBe('true');
    expect(runs).toBe(1);
  });
});
