// One store, three frameworks: an Express, a Fastify and a Koa server built as their guides say
// (the guard first, whose principal is the default scope; idempotency before the body parsers),
// each answering the same routes with the same handler, all on ONE store instance. A count of the
// handler's runs across the three is the effect that must happen once per key. What a migration
// (Express to Fastify, rolling) or a mixed fleet behind one gateway looks like to a retrying client.
import { createHmac, randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { promisify } from 'node:util';
import { createGunzip, gzip } from 'node:zlib';
import type { Store } from '@idem/core';
import { guard as expressGuard, idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { guard as fastifyGuard, idempotency as fastifyIdempotency } from '@idem/fastify';
import type { GuardOptions } from '@idem/guard';
import { guard as koaGuard, idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify from 'fastify';
import Koa, { type Context } from 'koa';
import { expect } from 'vitest';
import { type RawAnswer, rawRequest, sendRaw } from '../hostile/raw-http.js';
import { bodyParser } from './koa-body-parser.js';

export const ISSUER = 'https://id.xframe.test';
export const AUDIENCE = 'https://api.xframe.test';
const SECRET = 'a-cross-framework-audit-secret-of-32-bytes-at-least!';
export const guardOptions: GuardOptions = { audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] };

const b64 = (value: string) => Buffer.from(value).toString('base64url');

/** A real HS256 access token for `sub`, which every framework's guard verifies. */
export function tokenFor(sub: string): string {
  const now = Math.floor(Date.now() / 1000);
  const head = `${b64(JSON.stringify({ alg: 'HS256', typ: 'at+jwt' }))}.${b64(
    JSON.stringify({ iss: ISSUER, aud: AUDIENCE, sub, iat: now, exp: now + 600, client_id: 'app-1' }),
  )}`;
  return `${head}.${createHmac('sha256', SECRET).update(head).digest('base64url')}`;
}

export type FrameworkName = 'express' | 'fastify' | 'koa';
export const frameworkNames: readonly FrameworkName[] = ['express', 'fastify', 'koa'];

export interface Fleet {
  readonly servers: Record<FrameworkName, { port: number }>;
  /** Handler runs across the whole fleet, by route. */
  readonly runs: Record<string, number>;
  /** Opens the gate `/slow` waits on. */
  open(): void;
  /** Resolves once `/slow` has started running. */
  slowStarted(): Promise<void>;
  close(): Promise<void>;
}

export interface FleetOptions {
  store: Store;
  /** Express and Koa: mount idempotency app-wide (`app.use`) as their quick starts do, not on the routes. */
  appWide?: boolean;
  /** Extra core options every instance gets (strictKeys, fingerprint, ...). */
  extra?: Record<string, unknown>;
}

const gzipped = promisify(gzip);

interface Reply {
  status: number;
  headers: Record<string, string | string[]>;
  body: Buffer | undefined;
}

/**
 * What every route answers, the same on every framework: a 201 with a Location, an ETag, a header
 * the app asks to be replayed and a cookie that must never be, and the framework that ran it in the
 * body (so a replay and a second run are told apart).
 */
async function replyFor(route: string, framework: FrameworkName, n: number): Promise<Reply> {
  const common = { 'x-charge-version': `v${n}`, 'set-cookie': [`session=s${n}; Path=/`] };
  if (route === 'empty') return { status: 204, headers: { ...common, etag: `"e${n}"` }, body: undefined };
  const json = Buffer.from(JSON.stringify({ id: `ch_${n}`, ranOn: framework, route }));
  if (route === 'gz') {
    return {
      status: 201,
      headers: {
        ...common,
        'content-type': 'application/json; charset=utf-8',
        'content-encoding': 'gzip',
        vary: 'Accept-Encoding',
      },
      body: await gzipped(json),
    };
  }
  return {
    status: 201,
    headers: {
      ...common,
      'content-type': 'application/json; charset=utf-8',
      location: `/charges/ch_${n}`,
      etag: `"e${n}"`,
    },
    body: json,
  };
}

export async function startFleet(options: FleetOptions): Promise<Fleet> {
  const runs: Record<string, number> = {};
  let total = 0;
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  let started!: () => void;
  const slowStarted = new Promise<void>((resolve) => {
    started = resolve;
  });
  const run = async (route: string, framework: FrameworkName): Promise<Reply> => {
    runs[route] = (runs[route] ?? 0) + 1;
    const n = ++total;
    if (route === 'slow') {
      started();
      await gate;
    }
    return replyFor(route, framework, n);
  };
  const idem = { store: options.store, replayHeaders: ['x-charge-version'], ...options.extra };

  // Express: guard, then idempotency on each route (or app-wide), then the parsers.
  const ex = express();
  ex.use(expressGuard(guardOptions));
  const exIdem = expressIdempotency(idem);
  if (options.appWide) ex.use(exIdem);
  const parsers = [
    express.json(),
    express.urlencoded({ extended: false }),
    express.text(),
    express.raw({ type: 'application/octet-stream' }),
  ];
  const exRoute = (method: 'post' | 'patch', path: string, route: string) => {
    const before = options.appWide ? parsers : [exIdem, ...parsers];
    ex[method](path, ...before, (_req: express.Request, res: express.Response, next: express.NextFunction) => {
      run(route, 'express').then((reply) => {
        res.status(reply.status).set(reply.headers);
        if (reply.body === undefined) res.end();
        else res.end(reply.body);
      }, next);
    });
  };
  exRoute('post', '/charges', 'charges');
  exRoute('patch', '/charges/:id', 'charge');
  exRoute('post', '/empty', 'empty');
  exRoute('post', '/gz', 'gz');
  exRoute('post', '/slow', 'slow');
  // A nested router mounted at a path with a parameter (`mergeParams`), as account-scoped APIs do.
  const accounts = express.Router({ mergeParams: true });
  accounts.patch('/charges/:id', ...(options.appWide ? parsers : [exIdem, ...parsers]), (_req, res, next) => {
    run('account-charge', 'express').then((reply) => {
      res.status(reply.status).set(reply.headers).end(reply.body);
    }, next);
  });
  ex.use('/accounts/:acct', accounts);
  ex.use(idempotencyErrors());
  const exServer = ex.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => exServer.once('listening', () => resolve()));

  // Fastify: the guard's hook, then the plugin, then the routes; parsers for forms and bytes.
  const fa = Fastify();
  fa.addHook('onRequest', fastifyGuard(guardOptions));
  fa.addContentTypeParser(
    ['application/x-www-form-urlencoded', 'application/octet-stream'],
    { parseAs: 'buffer' },
    (_request, body, done) => done(null, body),
  );
  // What @fastify/compress does for a gzip request body (registered first, as usual): the parser
  // reads it decoded, with the encoded length counted for Fastify's Content-Length check.
  fa.addHook('preParsing', async (request, _reply, payload) => {
    if (request.headers['content-encoding'] !== 'gzip') return payload;
    const decoded = payload.pipe(createGunzip()) as unknown as typeof payload & { receivedEncodedLength: number };
    decoded.receivedEncodedLength = 0;
    payload.on('data', (chunk: Buffer) => {
      decoded.receivedEncodedLength += chunk.length;
    });
    return decoded;
  });
  await fa.register(fastifyIdempotency, idem);
  const faRoute = (method: 'post' | 'patch', path: string, route: string) => {
    fa[method](path, async (_request, reply) => {
      const out = await run(route, 'fastify');
      reply.code(out.status).headers(out.headers);
      return reply.send(out.body ?? '');
    });
  };
  faRoute('post', '/charges', 'charges');
  faRoute('patch', '/charges/:id', 'charge');
  faRoute('post', '/empty', 'empty');
  faRoute('post', '/gz', 'gz');
  faRoute('post', '/slow', 'slow');
  await fa.register(
    async (child) => {
      child.patch('/charges/:id', async (_request, reply) => {
        const out = await run('account-charge', 'fastify');
        reply.code(out.status).headers(out.headers);
        return reply.send(out.body ?? '');
      });
    },
    { prefix: '/accounts/:acct' },
  );
  await fa.listen({ port: 0, host: '127.0.0.1' });

  // Koa: guard, then a stand-in for @koa/router (not installed) leaving on the context what the
  // real one leaves while a route layer runs, then idempotency on the route (or app-wide), then the
  // body parser, then the handler.
  const ko = new Koa();
  ko.silent = true;
  ko.use(koaGuard(guardOptions));
  const koIdem = koaIdempotency(idem);
  if (options.appWide) ko.use(koIdem);
  const koRoutes: Array<{ method: string; pattern: RegExp; template: string; route: string }> = [
    { method: 'POST', pattern: /^\/charges\/?$/i, template: '/charges', route: 'charges' },
    { method: 'PATCH', pattern: /^\/charges\/[^/]+\/?$/i, template: '/charges/:id', route: 'charge' },
    { method: 'POST', pattern: /^\/empty\/?$/i, template: '/empty', route: 'empty' },
    { method: 'POST', pattern: /^\/gz\/?$/i, template: '/gz', route: 'gz' },
    { method: 'POST', pattern: /^\/slow\/?$/i, template: '/slow', route: 'slow' },
    // What @koa/router leaves for a nested router: `parent.use('/accounts/:acct', child.routes())`.
    {
      method: 'PATCH',
      pattern: /^\/accounts\/[^/]+\/charges\/[^/]+\/?$/i,
      template: '/accounts/:acct/charges/:id',
      route: 'account-charge',
    },
  ];
  const parse = bodyParser({ enableTypes: ['json', 'form', 'text'] });
  ko.use(async (ctx: Context, next) => {
    const found = koRoutes.find((r) => r.method === ctx.method && r.pattern.test(ctx.path));
    if (found === undefined) return next();
    if (!options.appWide) {
      Object.assign(ctx, {
        router: {},
        _matchedRoute: found.template,
        matched: [{ path: found.template, methods: [found.method] }],
      });
    }
    const handler = async () => {
      await parse(ctx, async () => undefined);
      const out = await run(found.route, 'koa');
      ctx.status = out.status;
      ctx.set(out.headers);
      if (out.body !== undefined) ctx.body = out.body;
    };
    if (options.appWide) return handler();
    return koIdem(ctx, handler);
  });
  const koServer = ko.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => koServer.once('listening', () => resolve()));

  return {
    servers: {
      express: { port: (exServer.address() as AddressInfo).port },
      fastify: { port: (fa.server.address() as AddressInfo).port },
      koa: { port: (koServer.address() as AddressInfo).port },
    },
    runs,
    open: () => open(),
    slowStarted: () => slowStarted,
    close: async () => {
      open();
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

export interface Send {
  method?: string;
  path: string;
  key?: string;
  contentType?: string;
  body?: Buffer | string;
  chunked?: boolean;
  headers?: Array<[string, string]>;
  user?: string;
}

export function build(send: Send): Buffer {
  const body = typeof send.body === 'string' ? Buffer.from(send.body) : (send.body ?? Buffer.alloc(0));
  const headers: Array<[string, string]> = [['Authorization', `Bearer ${tokenFor(send.user ?? 'user-1')}`]];
  if (send.key !== undefined) headers.push(['Idempotency-Key', send.key]);
  if (send.contentType !== undefined) headers.push(['Content-Type', send.contentType]);
  headers.push(...(send.headers ?? []));
  if (!send.chunked) return rawRequest({ method: send.method ?? 'POST', path: send.path, headers, body });
  headers.push(['Transfer-Encoding', 'chunked']);
  const half = Math.ceil(body.length / 2);
  const chunks: Buffer[] = [];
  for (const piece of [body.subarray(0, half), body.subarray(half)]) {
    if (piece.length > 0) chunks.push(Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n'));
  }
  chunks.push(Buffer.from('0\r\n\r\n'));
  return rawRequest({
    method: send.method ?? 'POST',
    path: send.path,
    headers,
    body: Buffer.concat(chunks),
    contentLength: false,
  });
}

export const to = (fleet: Fleet, framework: FrameworkName, send: Send): Promise<RawAnswer> =>
  sendRaw(fleet.servers[framework].port, build(send));

/** What a client compares between the first answer and a replay of it. */
export const outcome = (answer: RawAnswer) => ({
  status: answer.status,
  body: answer.body,
  'content-type': answer.headers['content-type'],
  'content-encoding': answer.headers['content-encoding'],
  location: answer.headers.location,
  etag: answer.headers.etag,
  'x-charge-version': answer.headers['x-charge-version'],
});

/**
 * Sends `first` to `origin`, then each of `retries` to every other framework, under one key, and
 * returns the answers: the first executes, every retry is a replay of it.
 */
/** Handler runs across the fleet, every route. */
export const totalRuns = (fleet: Fleet) => Object.values(fleet.runs).reduce((a, b) => a + b, 0);

export async function acrossFleet(fleet: Fleet, origin: FrameworkName, first: Send, retries: readonly Send[]) {
  const key = randomUUID();
  const before = totalRuns(fleet);
  const one = await to(fleet, origin, { ...first, key });
  const answers: Array<{ on: FrameworkName; retry: number; status: number; code?: string; replayed?: string }> = [];
  const mismatched: string[] = [];
  for (const framework of frameworkNames) {
    if (framework === origin) continue;
    for (const [i, retry] of retries.entries()) {
      const again = await to(fleet, framework, { ...retry, key });
      answers.push({ on: framework, retry: i, status: again.status, replayed: again.headers['idempotent-replayed'] });
      if (JSON.stringify(outcome(again)) !== JSON.stringify(outcome(one))) {
        mismatched.push(`${origin} -> ${framework} #${i}: ${again.status} ${again.body.slice(0, 160)}`);
      }
    }
  }
  return { one, answers, mismatched, runs: totalRuns(fleet) - before };
}

/** Every origin, every other framework: the first runs once, every retry replays it, byte for byte. */
export async function expectReplayedEverywhere(fleet: Fleet, first: Send, retries: readonly Send[] = []) {
  for (const origin of frameworkNames) {
    const { one, answers, mismatched, runs } = await acrossFleet(fleet, origin, first, [first, ...retries]);
    expect(one.status, origin).toBeLessThan(300);
    expect(mismatched, `${first.method ?? 'POST'} ${first.path} first on ${origin}`).toEqual([]);
    expect(new Set(answers.map((a) => `${a.status} ${a.replayed}`)), origin).toEqual(new Set([`${one.status} true`]));
    expect(runs, origin).toBe(1);
  }
}
