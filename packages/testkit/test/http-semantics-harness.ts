// One app, three frameworks, for the HTTP-semantics audit (http-semantics.audit.test.ts): the
// idempotency middleware app-wide (methods POST, PATCH, PUT, DELETE), and routes whose handler is
// steered by the request's `x-act` header, written the framework's own way where it has one.
import { request as httpRequest, type IncomingHttpHeaders, type OutgoingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { memoryStore } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';

export const frameworks = ['express', 'fastify', 'koa'] as const;
export type Framework = (typeof frameworks)[number];

export interface App {
  url: string;
  port: number;
  runs(): number;
  close(): Promise<void>;
}

/** What a handler answers for an `x-act`. */
interface Plan {
  status: number;
  headers: Record<string, string>;
  body?: Buffer | string;
  hints?: boolean;
  trailers?: boolean;
}

export const gzipped = gzipSync(Buffer.from('{"ok":true}'));

function planOf(act: string | undefined, n: number): Plan {
  switch (act) {
    case 'gzip':
      return {
        status: 201,
        headers: { 'content-type': 'application/json', 'content-encoding': 'gzip', vary: 'Accept-Encoding' },
        body: gzipped,
      };
    case '304':
      return { status: 304, headers: { etag: '"v1"' } };
    case '204':
      return { status: 204, headers: { etag: '"v2"', location: '/r/1' } };
    case 'hints':
      return { status: 201, headers: { 'content-type': 'text/plain' }, body: `ran ${n}`, hints: true };
    case '206':
      return {
        status: 206,
        headers: { 'content-type': 'text/plain', 'content-range': 'bytes 0-3/10', 'accept-ranges': 'bytes' },
        body: 'ran ',
      };
    case '405':
      return { status: 405, headers: { 'content-type': 'text/plain', allow: 'POST' }, body: 'use POST' };
    case 'trailers':
      return { status: 200, headers: { 'content-type': 'text/plain' }, body: `ran ${n}`, trailers: true };
    default:
      return { status: 201, headers: { 'content-type': 'text/plain', etag: '"r1"' }, body: `ran ${n}` };
  }
}

const act = (headers: IncomingHttpHeaders) => {
  const value = headers['x-act'];
  return typeof value === 'string' ? value : undefined;
};

export async function startApp(framework: Framework, extra: Record<string, unknown> = {}): Promise<App> {
  let runs = 0;
  const settings = {
    store: memoryStore(),
    scope: () => 'tenant-1',
    methods: ['POST', 'PATCH', 'PUT', 'DELETE'],
    ...extra,
  };
  const paths = ['/r', '/items/:id'];
  let server: import('node:http').Server;
  let close: () => Promise<void>;
  if (framework === 'express') {
    const app = express();
    app.use(expressIdempotency(settings));
    app.use(express.json());
    const handler = (req: express.Request, res: express.Response) => {
      const plan = planOf(act(req.headers), ++runs);
      if (plan.hints) res.writeEarlyHints({ link: '</a.css>; rel=preload; as=style' });
      if (plan.trailers) {
        res.writeHead(plan.status, { ...plan.headers, trailer: 'x-checksum' } as OutgoingHttpHeaders);
        res.write(plan.body as string);
        res.addTrailers({ 'x-checksum': 'c1' });
        res.end();
        return;
      }
      res.status(plan.status).set(plan.headers);
      if (plan.body === undefined) res.end();
      else res.send(plan.body);
    };
    for (const path of paths) {
      app.post(path, handler);
      app.put(path, handler);
      app.delete(path, handler);
    }
    app.use(idempotencyErrors());
    server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    close = () => new Promise<void>((resolve) => server.close(() => resolve()));
  } else if (framework === 'fastify') {
    const app = Fastify();
    await app.register(fastifyIdempotency, settings);
    app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
    for (const path of paths) {
      app.route({
        method: ['POST', 'PUT', 'DELETE'],
        url: path,
        handler: async (request, reply) => {
          const plan = planOf(act(request.headers), ++runs);
          if (plan.hints) reply.writeEarlyHints({ link: '</a.css>; rel=preload; as=style' });
          reply.code(plan.status).headers(plan.headers);
          if (plan.trailers) {
            reply.trailer('x-checksum', async () => 'c1');
            return reply.send(Readable.from([Buffer.from(plan.body as string)]));
          }
          return reply.send(plan.body);
        },
      });
    }
    await app.listen({ port: 0, host: '127.0.0.1' });
    server = app.server;
    close = () => app.close();
  } else {
    const app = new Koa();
    app.silent = true;
    app.use(koaIdempotency(settings));
    app.use(async (ctx) => {
      if (!['POST', 'PUT', 'DELETE'].includes(ctx.method)) return;
      if (ctx.path !== '/r' && !/^\/items\/[^/]+$/.test(ctx.path)) return;
      const plan = planOf(act(ctx.req.headers), ++runs);
      if (plan.hints) ctx.res.writeEarlyHints({ link: '</a.css>; rel=preload; as=style' });
      ctx.status = plan.status;
      ctx.set(plan.headers);
      if (plan.trailers) {
        ctx.set('trailer', 'x-checksum');
        ctx.res.addTrailers({ 'x-checksum': 'c1' });
        ctx.body = Readable.from([Buffer.from(plan.body as string)]);
        return;
      }
      if (plan.body !== undefined) ctx.body = plan.body;
    });
    server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    close = () => new Promise<void>((resolve) => server.close(() => resolve()));
  }
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    runs: () => runs,
    close: async () => {
      server.closeAllConnections();
      await close();
    },
  };
}

export interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  rawHeaders: string[];
  trailers: NodeJS.Dict<string>;
  informational: number[];
  body: Buffer;
}

export interface SendOptions {
  method?: string;
  /** The request target as sent: origin-form by default, or absolute-form (a proxy's). */
  path?: string;
  key?: string;
  headers?: Record<string, string>;
  body?: string;
}

/** One request over a fresh connection; the body is sent with a Content-Length. */
export function send(app: App, options: SendOptions = {}): Promise<Answer> {
  const body = options.body ?? '{"amount":1}';
  return new Promise<Answer>((resolve, reject) => {
    const informational: number[] = [];
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port: app.port,
        method: options.method ?? 'POST',
        path: options.path ?? '/r',
        agent: false,
        headers: {
          'content-type': 'application/json',
          'content-length': String(Buffer.byteLength(body)),
          ...(options.key === undefined ? {} : { 'idempotency-key': options.key }),
          ...options.headers,
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            rawHeaders: res.rawHeaders,
            trailers: res.trailers,
            informational,
            body: Buffer.concat(chunks),
          }),
        );
      },
    );
    req.on('information', (info) => informational.push(info.statusCode));
    req.on('error', reject);
    req.end(body);
  });
}
