// Servers for the "client left before the first chunk of a piped body" audit (pipe-left.audit*.ts):
// one route, POST /slow, on Express (stream.pipeline or source.pipe), Fastify (reply.send(stream))
// and Koa (ctx.body = stream, or stream.pipeline into ctx.res under ctx.respond = false), over
// HTTP/1.1 or h2c. Its first run pipes a source that has no data
// yet (a slow upstream) and says when the pipe went in; every later run answers `201 second run`
// whole. A client that leaves once the pipe went in is what the audit is about.
import { once } from 'node:events';
import { request as httpRequest, type ServerResponse } from 'node:http';
import {
  createServer as createH2Server,
  type Http2Session,
  connect as h2connect,
  constants as h2constants,
} from 'node:http2';
import type { AddressInfo } from 'node:net';
import { pipeline, Readable } from 'node:stream';
import type { HttpIdempotencyOptions, IdempotencyEvent, Store } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify, { type FastifyInstance } from 'fastify';
import Koa from 'koa';
import { afterEach } from 'vitest';

export type PipeLeftServerName = 'express-pipeline' | 'express-pipe' | 'fastify' | 'koa' | 'koa-raw';

/** Every server and protocol the pipe-left audits play (name, HTTP/2): h2c for Fastify and Koa. */
export const pipeLeftCases: Array<[PipeLeftServerName, boolean]> = [
  ['express-pipeline', false],
  ['express-pipe', false],
  ['fastify', false],
  ['fastify', true],
  ['koa', false],
  ['koa', true],
  ['koa-raw', false],
  ['koa-raw', true],
];

/** A list to push each test's servers to; they are closed after each test of the calling file. */
export function closedAfterEach(): PipeLeftServer[] {
  const servers: PipeLeftServer[] = [];
  afterEach(async () => {
    while (servers.length > 0) await servers.pop()?.close();
  });
  return servers;
}

export interface PipeLeftServer {
  readonly port: number;
  readonly http2: boolean;
  /** First executions so far. */
  runs(): number;
  /** Resolves once the first run's body stream went into the response. */
  readonly piped: Promise<void>;
  /** Resolves once the key of the first run was settled (stored or released), with what happened. */
  readonly settled: Promise<IdempotencyEvent[]>;
  close(): Promise<void>;
}

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

export async function startPipeLeftServer(
  name: PipeLeftServerName,
  store: Store,
  options: { http2?: boolean; extra?: Partial<HttpIdempotencyOptions<unknown>> } = {},
): Promise<PipeLeftServer> {
  const http2 = options.http2 === true;
  let runs = 0;
  let piped!: () => void;
  const pipedPromise = new Promise<void>((resolve) => {
    piped = resolve;
  });
  const events: IdempotencyEvent[] = [];
  let settled!: (events: IdempotencyEvent[]) => void;
  const settledPromise = new Promise<IdempotencyEvent[]>((resolve) => {
    settled = resolve;
  });
  const idem: HttpIdempotencyOptions<unknown> = {
    store,
    scope: () => 'tenant-pipe-left',
    // An hour: only an outcome settled at once answers the retry within the test.
    lease: '1h',
    onEvent: (event) => {
      events.push(event);
      if (event.type === 'complete' || event.type === 'release') settled(events);
    },
    ...options.extra,
  };
  // A source whose data has not arrived yet; the pipe into `res` is reported once it happened.
  const slowSource = (res: ServerResponse) => {
    res.once('pipe', () => piped());
    return new Readable({ read() {} });
  };
  let port: number;
  let closeServer: () => Promise<void>;
  const sessions = new Set<Http2Session>();
  const track = (server: { on(event: 'session', listener: (session: Http2Session) => void): unknown }) =>
    server.on('session', (session) => {
      sessions.add(session);
      session.once('close', () => sessions.delete(session));
    });

  if (name === 'express-pipeline' || name === 'express-pipe') {
    if (http2) throw new Error('Express does not serve HTTP/2');
    const app = express();
    app.post('/slow', expressIdempotency(idem), (_req, res) => {
      res.status(201).type('text/csv');
      if (++runs > 1) return void res.send('second run');
      const source = slowSource(res);
      if (name === 'express-pipeline') pipeline(source, res, () => undefined);
      else source.pipe(res);
    });
    app.use(idempotencyErrors());
    const server = app.listen(0, '127.0.0.1');
    await once(server, 'listening');
    port = (server.address() as AddressInfo).port;
    closeServer = async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    };
  } else if (name === 'fastify') {
    const app = (http2 ? Fastify({ http2: true }) : Fastify()) as unknown as FastifyInstance;
    if (http2) track(app.server as never);
    await app.register(fastifyIdempotency, idem);
    app.post('/slow', async (_request, reply) => {
      reply.code(201).type('text/csv');
      if (++runs > 1) return reply.send('second run');
      return reply.send(slowSource(reply.raw));
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    port = (app.server.address() as AddressInfo).port;
    closeServer = async () => {
      for (const session of sessions) session.destroy();
      if (!http2) app.server.closeAllConnections();
      await app.close();
    };
  } else {
    const app = new Koa();
    app.on('error', () => undefined);
    app.use(koaIdempotency(idem));
    app.use(async (ctx) => {
      if (ctx.method !== 'POST' || ctx.path !== '/slow') return;
      ctx.status = 201;
      ctx.type = 'text/csv';
      if (++runs > 1) ctx.body = 'second run';
      else if (name === 'koa') ctx.body = slowSource(ctx.res);
      else {
        ctx.respond = false;
        pipeline(slowSource(ctx.res), ctx.res, () => undefined);
      }
    });
    if (http2) {
      const server = createH2Server(app.callback());
      track(server);
      server.listen(0, '127.0.0.1');
      await once(server, 'listening');
      port = (server.address() as AddressInfo).port;
      closeServer = async () => {
        for (const session of sessions) session.destroy();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      };
    } else {
      const server = app.listen(0, '127.0.0.1');
      await once(server, 'listening');
      port = (server.address() as AddressInfo).port;
      closeServer = async () => {
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      };
    }
  }
  return {
    port,
    http2,
    runs: () => runs,
    piped: pipedPromise,
    settled: settledPromise,
    close: () => closeServer(),
  };
}

/**
 * A keyed POST /slow. With `leaveWhen`, the client leaves (destroys its connection, or over HTTP/2
 * cancels its stream) once it resolves, and the promise resolves with undefined; else with the answer.
 */
export function postSlow(
  server: PipeLeftServer,
  key: string,
  leaveWhen?: Promise<unknown>,
): Promise<Answer | undefined> {
  return server.http2 ? postH2(server.port, key, leaveWhen) : postH1(server.port, key, leaveWhen);
}

function postH1(port: number, key: string, leaveWhen?: Promise<unknown>): Promise<Answer | undefined> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({
      host: '127.0.0.1',
      port,
      path: '/slow',
      method: 'POST',
      agent: false,
      headers: { 'idempotency-key': key, 'content-type': 'application/json', 'content-length': '2' },
    });
    req.on('error', (error) => (leaveWhen === undefined ? reject(error) : resolve(undefined)));
    req.on('response', (res) => {
      const parts: Buffer[] = [];
      res.on('data', (chunk: Buffer) => parts.push(chunk));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts).toString() }),
      );
    });
    void leaveWhen?.then(() => {
      req.destroy();
      resolve(undefined);
    });
    req.end('{}');
  });
}

function postH2(port: number, key: string, leaveWhen?: Promise<unknown>): Promise<Answer | undefined> {
  return new Promise((resolve, reject) => {
    const session = h2connect(`http://127.0.0.1:${port}`);
    session.on('error', () => undefined);
    const stream = session.request({
      ':method': 'POST',
      ':path': '/slow',
      'idempotency-key': key,
      'content-type': 'application/json',
    });
    const parts: Buffer[] = [];
    let status = 0;
    let headers: Answer['headers'] = {};
    stream.on('response', (head) => {
      status = Number(head[':status']);
      headers = head as Answer['headers'];
    });
    stream.on('data', (chunk: Buffer) => parts.push(chunk));
    stream.on('end', () => {
      session.close();
      resolve({ status, headers, body: Buffer.concat(parts).toString() });
    });
    stream.on('error', (error) => {
      session.close();
      if (leaveWhen === undefined) reject(error);
    });
    void leaveWhen?.then(() => {
      stream.close(h2constants.NGHTTP2_CANCEL);
      session.close();
      resolve(undefined);
    });
    stream.end('{}');
  });
}

/** Rejects after `ms` with `what`, for a wait that would otherwise hang the test on the old code. */
export function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
