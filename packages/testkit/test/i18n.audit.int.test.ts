// Audit (internationalisation and text encoding): what crosses the HTTP boundary in something other
// than ASCII, on Express, Fastify and Koa, over the real Redis and PostgreSQL stores. Keys with
// bytes outside ASCII are refused 400 (never a 500, never a key made of mangled text); stored
// responses with latin1 and UTF-8 bytes in their headers and a Shift_JIS or binary body are replayed
// byte for byte; request bodies in other encodings fingerprint alike on every framework.
import { randomBytes, randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { Store } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, type RawAnswer, redisAnswers, sendRaw, serviceAvailable } from '@idem/testkit';
import express from 'express';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import Koa, { type Context } from 'koa';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';
import { bodyParser } from './audit-support/koa-body-parser.js';
import { rawRequest } from './hostile/raw-http.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
// A table of this file's own (dropped afterwards) in the database the suite is given.
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const skipped = 'the i18n audit over it';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);
const withPostgres = serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), skipped);
const tag = randomBytes(4).toString('hex');

type FrameworkName = 'express' | 'fastify' | 'koa';
const frameworks: readonly FrameworkName[] = ['express', 'fastify', 'koa'];

// 日本語 in Shift_JIS: bytes that are no UTF-8, so any decode and re-encode on the way shows.
const shiftJis = Buffer.from([0x93, 0xfa, 0x96, 0x7b, 0x8c, 0xea]);
// A header value as Node holds one: a JS string whose code units are the bytes sent (latin1). `é` is
// the latin1 byte 0xE9, as RFC 6266's legacy `filename` has it; the Link carries the UTF-8 bytes of
// an IRI, which is what servers that put UTF-8 into a field do.
const disposition = `attachment; filename="r\u00e9sum\u00e9.txt"; filename*=UTF-8''r%C3%A9sum%C3%A9.txt`;
const link = `<${Buffer.from('https://bücher.example/日本').toString('latin1')}>; rel="alternate"`;

interface Fleet {
  ports: Record<FrameworkName, number>;
  /** Handler runs, by route. */
  runs: Record<string, number>;
  /** The bodies the handler was given, by route, in order. */
  seen: Record<string, unknown[]>;
  close(): Promise<void>;
}

/** What each route answers: a download with odd bytes everywhere, or a JSON echo of a run number. */
function reply(route: string, n: number, body: unknown) {
  if (route === 'download') {
    return {
      status: 201,
      headers: {
        'content-type': 'text/plain; charset=shift_jis',
        'content-disposition': disposition,
        'content-language': 'ja',
        link,
      } as Record<string, string>,
      body: Buffer.concat([shiftJis, Buffer.from([0x00, 0xff, 0xfe, 0x0d, 0x0a]), Buffer.from(`#${n}`)]),
    };
  }
  return {
    status: 201,
    headers: { 'content-type': 'application/json; charset=utf-8' } as Record<string, string>,
    body: Buffer.from(JSON.stringify({ n, body })),
  };
}

async function startFleet(store: Store): Promise<Fleet> {
  const runs: Record<string, number> = {};
  const seen: Record<string, unknown[]> = {};
  let total = 0;
  const run = (route: string, body: unknown) => {
    runs[route] = (runs[route] ?? 0) + 1;
    seen[route] = [...(seen[route] ?? []), body];
    total++;
    return reply(route, total, body);
  };
  const idem = {
    store,
    scope: () => 'audit-i18n',
    replayHeaders: ['content-disposition'],
    storeTimeout: '15s' as const,
  };

  const ex = express();
  const parsers = [express.json(), express.urlencoded({ extended: false }), express.text()];
  for (const route of ['download', 'echo']) {
    ex.post(`/${route}`, expressIdempotency(idem), ...parsers, (req: express.Request, res: express.Response) => {
      const out = run(route, req.body);
      res.status(out.status).set(out.headers).end(out.body);
    });
  }
  ex.use(idempotencyErrors());
  const exServer = ex.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => exServer.once('listening', () => resolve()));

  const fa = Fastify();
  fa.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string' }, (_request, body, done) =>
    done(null, Object.fromEntries(new URLSearchParams(body as string))),
  );
  await fa.register(fastifyIdempotency, idem);
  for (const route of ['download', 'echo']) {
    fa.post(`/${route}`, async (request, res) => {
      const out = run(route, request.body);
      res.code(out.status).headers(out.headers);
      return res.send(out.body);
    });
  }
  await fa.listen({ port: 0, host: '127.0.0.1' });

  const ko = new Koa();
  ko.silent = true;
  const koIdem = koaIdempotency(idem);
  const parse = bodyParser({ enableTypes: ['json', 'form', 'text'] });
  ko.use(async (ctx: Context, next) => {
    const route = ctx.path.slice(1);
    if (ctx.method !== 'POST' || !['download', 'echo'].includes(route)) return next();
    Object.assign(ctx, { router: {}, _matchedRoute: `/${route}`, matched: [{ path: `/${route}`, methods: ['POST'] }] });
    return koIdem(ctx, async () => {
      await parse(ctx, async () => undefined);
      const out = run(route, (ctx.request as { body?: unknown }).body);
      ctx.status = out.status;
      ctx.set(out.headers);
      ctx.body = out.body;
    });
  });
  const koServer = ko.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => koServer.once('listening', () => resolve()));

  return {
    ports: {
      express: (exServer.address() as AddressInfo).port,
      fastify: (fa.server.address() as AddressInfo).port,
      koa: (koServer.address() as AddressInfo).port,
    },
    runs,
    seen,
    close: async () => {
      exServer.closeAllConnections();
      koServer.closeAllConnections();
      await Promise.all([
        new Promise<void>((resolve) => exServer.close(() => resolve())),
        new Promise<void>((resolve) => koServer.close(() => resolve())),
        fa.close(),
      ]);
    },
  };
}

interface Send {
  path: string;
  /** The Idempotency-Key field value, as bytes when they are not ASCII. */
  key?: string | Buffer;
  contentType?: string;
  body?: Buffer | string;
}

/** A request whose head is written byte for byte: a key given as bytes goes on the wire as they are. */
function send(port: number, request: Send): Promise<RawAnswer> {
  const body = typeof request.body === 'string' ? Buffer.from(request.body) : (request.body ?? Buffer.alloc(0));
  const headers: Array<[string, string | Buffer]> = [];
  if (request.key !== undefined) headers.push(['Idempotency-Key', request.key]);
  if (request.contentType !== undefined) headers.push(['Content-Type', request.contentType]);
  return sendRaw(port, rawRequest({ method: 'POST', path: request.path, headers, body }));
}

/** The bytes of one header field's value as it was on the wire (the head read as latin1 is bytes). */
function headerBytes(answer: RawAnswer, name: string): Buffer | undefined {
  for (const line of answer.head.split('\r\n')) {
    if (line.toLowerCase().startsWith(`${name}:`)) return Buffer.from(line.slice(name.length + 1).trim(), 'latin1');
  }
  return undefined;
}

function describeFleet(name: string, makeStore: () => Store, enabled: boolean) {
  describe.runIf(enabled)(`${name}: Express, Fastify and Koa`, () => {
    let fleet: Fleet;
    beforeAll(async () => {
      fleet = await startFleet(makeStore());
    });
    afterAll(async () => {
      await fleet?.close();
    });

    it.each([
      ['UTF-8 bytes', Buffer.from('ключ-1')],
      ['a latin1 byte (obs-text)', Buffer.from([0x6b, 0xe9, 0x79])],
      ['a quoted string with a UTF-8 byte', Buffer.concat([Buffer.from('"k'), Buffer.from('é'), Buffer.from('y"')])],
      ['300 bytes of UTF-8', Buffer.from('é'.repeat(150))],
      ['a lone C1 control', Buffer.from([0x6b, 0x85, 0x79])],
    ])('a key with %s is refused 400 key_invalid, and nothing runs', async (_what, key) => {
      for (const framework of frameworks) {
        const before = fleet.runs.echo ?? 0;
        const answer = await send(fleet.ports[framework], {
          path: '/echo',
          key,
          contentType: 'application/json',
          body: '{}',
        });
        expect(answer.status, framework).toBe(400);
        expect(answer.headers['content-type'], framework).toMatch(/^application\/problem\+json/);
        expect(JSON.parse(answer.body.toString('utf8')).code, framework).toBe('key_invalid');
        expect(fleet.runs.echo ?? 0, framework).toBe(before);
      }
    });

    it('replays latin1 and UTF-8 header bytes and a Shift_JIS and binary body byte for byte', async () => {
      for (const framework of frameworks) {
        const key = randomUUID();
        const first = await send(fleet.ports[framework], {
          path: '/download',
          key,
          contentType: 'text/plain',
          body: 'x',
        });
        expect(first.status, framework).toBe(201);
        // Node itself rewrites a Content-Disposition it writes together with a Content-Length
        // (setHeader, then end(body)): each latin1 character goes out as 0xFD (nodejs/node#46528
        // turns the value into a Buffer that is then read as UTF-8). Not idem's doing, and only on
        // the first answer: a replay writes its stored headers with writeHead, as the handler set them.
        expect(headerBytes(first, 'content-disposition'), framework).toBeDefined();
        expect(headerBytes(first, 'link'), framework).toEqual(Buffer.from(link, 'latin1'));
        expect(first.body.subarray(0, shiftJis.length), framework).toEqual(shiftJis);
        for (const other of frameworks) {
          const again = await send(fleet.ports[other], {
            path: '/download',
            key,
            contentType: 'text/plain',
            body: 'x',
          });
          const on = `${framework} then ${other}`;
          expect(again.status, on).toBe(201);
          expect(again.headers['idempotent-replayed'], on).toBe('true');
          expect(again.body, on).toEqual(first.body);
          expect(headerBytes(again, 'content-disposition'), on).toEqual(Buffer.from(disposition, 'latin1'));
          for (const header of ['link', 'content-type', 'content-language']) {
            expect(headerBytes(again, header), `${on}: ${header}`).toEqual(headerBytes(first, header));
          }
        }
      }
    });

    it('a JSON body with a UTF-8 BOM is the same request as without it, and a retry with the same bytes replays', async () => {
      const json = '{"name":"Zoë","city":"東京"}';
      for (const framework of frameworks) {
        const key = randomUUID();
        const before = fleet.runs.echo ?? 0;
        const plain = Buffer.from(json);
        const bom = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), plain]);
        const first = await send(fleet.ports[framework], {
          path: '/echo',
          key,
          contentType: 'application/json',
          body: plain,
        });
        expect(first.status, framework).toBe(201);
        expect(JSON.parse(first.body.toString()).body, framework).toEqual(JSON.parse(json));
        for (const body of [plain, bom]) {
          const again = await send(fleet.ports[framework], {
            path: '/echo',
            key,
            contentType: 'application/json',
            body,
          });
          expect(again.status, framework).toBe(201);
          expect(again.body, framework).toEqual(first.body);
        }
        expect((fleet.runs.echo ?? 0) - before, framework).toBe(1);
      }
    });

    it('the same JSON text in NFC and in NFD is two requests (422), not a replay of the other', async () => {
      for (const framework of frameworks) {
        const key = randomUUID();
        const nfc = '{"name":"Zoë"}';
        const first = await send(fleet.ports[framework], {
          path: '/echo',
          key,
          contentType: 'application/json',
          body: nfc,
        });
        expect(first.status, framework).toBe(201);
        const other = await send(fleet.ports[framework], {
          path: '/echo',
          key,
          contentType: 'application/json',
          body: nfc.normalize('NFD'),
        });
        expect(other.status, framework).toBe(422);
      }
    });

    it('a form body with percent-encoded UTF-8 replays for the same bytes and is another request for other text', async () => {
      for (const framework of frameworks) {
        const key = randomUUID();
        const form = 'application/x-www-form-urlencoded';
        const body = `name=${encodeURIComponent('Zoë Åström')}&city=${encodeURIComponent('東京')}`;
        const first = await send(fleet.ports[framework], { path: '/echo', key, contentType: form, body });
        expect(first.status, framework).toBe(201);
        expect(JSON.parse(first.body.toString()).body, framework).toEqual({ name: 'Zoë Åström', city: '東京' });
        const again = await send(fleet.ports[framework], { path: '/echo', key, contentType: form, body });
        expect(again.headers['idempotent-replayed'], framework).toBe('true');
        const other = await send(fleet.ports[framework], {
          path: '/echo',
          key,
          contentType: form,
          body: `name=${encodeURIComponent('Zoe Astrom')}&city=${encodeURIComponent('東京')}`,
        });
        expect(other.status, framework).toBe(422);
      }
    });

    // Was wrong: the fingerprint kept the media type without its parameters, so the same bytes sent
    // as `text/plain; charset=shift_jis` and as `text/plain; charset=iso-8859-1` were one request, yet
    // a parser that decodes by the charset (express.text) gives the handler two different texts: the
    // second, under the first's key, got the first's stored answer where it should get 422. A
    // charset other than UTF-8 is now framed into the fingerprint; UTF-8 (or none) is not, so the
    // fingerprints of nearly all records stored before stay as they were.
    it('the same bytes under another charset are another request (422), not a replay', async () => {
      const bytes = shiftJis;
      for (const framework of ['express', 'koa'] as const) {
        const key = randomUUID();
        const first = await send(fleet.ports[framework], {
          path: '/echo',
          key,
          contentType: 'text/plain; charset=shift_jis',
          body: bytes,
        });
        expect(first.status, framework).toBe(201);
        // express.text decodes by the charset; @koa/bodyparser (co-body) reads every text body as
        // UTF-8, so its handler sees the same text both times, and 422 is the safe side there.
        if (framework === 'express') expect(JSON.parse(first.body.toString()).body, framework).toBe('日本語');
        const other = await send(fleet.ports[framework], {
          path: '/echo',
          key,
          contentType: 'text/plain; charset=iso-8859-1',
          body: bytes,
        });
        // The handler would read `\x93ú\x96{\x8Cê` here: another text, so another request.
        expect(other.status, framework).toBe(422);
      }
    });

    it('a UTF-16 JSON body retried with the same bytes replays or is refused, never runs twice or fails 500', async () => {
      const utf16 = Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from('{"name":"Zoë"}', 'utf16le')]);
      for (const framework of frameworks) {
        const key = randomUUID();
        const before = fleet.runs.echo ?? 0;
        const request = { path: '/echo', key, contentType: 'application/json; charset=utf-16', body: utf16 };
        const first = await send(fleet.ports[framework], request);
        const again = await send(fleet.ports[framework], request);
        expect(first.status, framework).toBeLessThan(500);
        expect(again.status, framework).toBe(first.status);
        expect((fleet.runs.echo ?? 0) - before, framework).toBeLessThanOrEqual(1);
      }
    });
  });
}

let redis: Redis | undefined;
const redisPrefix = `audit-i18n:${tag}:`;
let pool: pg.Pool | undefined;
const table = `idem_audit_i18n_${tag}`;

beforeAll(async () => {
  if (withRedis) redis = new Redis(redisUrl);
  if (withPostgres) {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 5 });
    pool.on('error', () => undefined);
    await migrate(pool, { table });
  }
});

afterAll(async () => {
  if (redis) {
    await deleteKeys(redis, redisPrefix);
    await redis.quit();
  }
  if (pool) {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  }
});

describeFleet('Redis', () => redisStore({ client: redis as Redis, prefix: redisPrefix }), withRedis);
describeFleet('PostgreSQL', () => postgresStore({ client: pool as pg.Pool, table }), withPostgres);
