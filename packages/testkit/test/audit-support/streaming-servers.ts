// Three servers (Express, Fastify, Koa) answering one route, POST /stream/:name, with a body the
// test describes as a plan: a status, headers, and bytes that go out the way each framework streams
// (a pipeline or a Readable, writes that wait for 'drain', a file, one buffer). For the streaming
// audit (streaming.audit.int.test.ts): what the first caller receives, what is stored, and what a
// retry gets, for large, slow, failed and abandoned streamed bodies.
import { once } from 'node:events';
import fs from 'node:fs';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import {
  createServer as createH2Server,
  type Http2Server,
  type Http2Session,
  connect as h2connect,
  constants as h2constants,
} from 'node:http2';
import type { AddressInfo } from 'node:net';
import { pipeline, Readable } from 'node:stream';
import { ReadableStream } from 'node:stream/web';
import v8 from 'node:v8';
import vm from 'node:vm';
import type { HttpIdempotencyOptions, IdempotencyContext, IdempotencyEvent, Store } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify, { type FastifyInstance } from 'fastify';
import Koa from 'koa';
import { expect } from 'vitest';

export type FrameworkName = 'express' | 'fastify' | 'koa';
/** Express 4 (the `express4` alias) as well: the middleware says it uses nothing Express 4 lacks. */
export type ServerName = FrameworkName | 'express4';
export const frameworkNames: readonly FrameworkName[] = ['express', 'fastify', 'koa'];

/**
 * How a plan's bytes leave the handler:
 * - `stream`: a Readable of the chunks (Express `stream.pipeline(readable, res)`, Fastify
 *   `reply.send(readable)`, Koa `ctx.body = readable`);
 * - `writes`: one write per chunk, awaiting 'drain' when a write says so (Express `res.write`,
 *   Fastify `reply.raw` after `reply.hijack()`, Koa `ctx.res` with `ctx.respond = false`);
 * - `web`: a web ReadableStream of the chunks (Express through `Readable.fromWeb`, Fastify
 *   `reply.send(stream)`, Koa `ctx.body = stream`);
 * - `response`: a fetch `Response` of that web stream, with the plan's status and headers (Fastify
 *   `reply.send(response)`, Koa `ctx.body = response`; Express pipes its body);
 * - `file`: the file at `file` (Express `res.sendFile`, Fastify and Koa a `fs.createReadStream`);
 * - `buffer`: every chunk joined, sent at once.
 */
export type PlanMode = 'stream' | 'web' | 'response' | 'writes' | 'file' | 'buffer';

export interface Plan {
  status: number;
  headers?: Record<string, string>;
  mode: PlanMode;
  /** The body's chunks; a generator that throws fails the body there. */
  chunks?: () => AsyncIterable<Buffer>;
  file?: string;
  /** Called as the handler starts, with its execution's context (`release()`, `keyFor`, ...). */
  onStart?: (context: IdempotencyContext | undefined) => void;
}

export interface StreamServerOptions {
  store: Store;
  /** Core options for the middleware (maxResponseBytes, lease, ...). */
  extra?: Record<string, unknown>;
  onEvent?: (event: IdempotencyEvent) => void;
  /** Serve h2c (HTTP/2 without TLS): Fastify's `http2: true`, Koa on `http2.createServer`. Not Express. */
  http2?: boolean;
}

export interface StreamServer {
  readonly port: number;
  /** Handler runs, by plan name. */
  readonly runs: Record<string, number>;
  /** Resolves when the handler of `name` has finished (returned, thrown, or its stream ended or failed). */
  finished(name: string): Promise<void>;
  close(): Promise<void>;
}

type Plans = Record<string, Plan>;

const joined = async (plan: Plan): Promise<Buffer> => {
  const parts: Buffer[] = [];
  for await (const chunk of plan.chunks?.() ?? []) parts.push(chunk);
  return Buffer.concat(parts);
};

/** The chunks as a web ReadableStream; `finish` once it ended, failed or was cancelled. */
function webStreamOf(plan: Plan, finish: () => void): ReadableStream<Uint8Array> {
  const iterator = (plan.chunks?.() ?? (async function* () {})())[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const next = await iterator.next();
        if (next.done) {
          controller.close();
          finish();
        } else controller.enqueue(next.value);
      } catch (error) {
        controller.error(error);
        finish();
      }
    },
    async cancel() {
      await iterator.return?.();
      finish();
    },
  });
}

/** The chunks as the body of a fetch Response with the plan's status and headers. */
function responseOf(plan: Plan, finish: () => void): Response {
  return new Response(webStreamOf(plan, finish) as unknown as BodyInit, {
    status: plan.status,
    headers: plan.headers ?? {},
  });
}

/** Writes the chunks to a raw response, waiting for 'drain'; stops if the response closes. */
async function writeAll(res: NodeJS.WritableStream & { destroyed: boolean }, plan: Plan): Promise<void> {
  try {
    for await (const chunk of plan.chunks?.() ?? []) {
      if (res.destroyed) return;
      if (!res.write(chunk)) {
        await Promise.race([once(res, 'drain'), once(res, 'close')]);
      }
    }
  } catch (error) {
    // The body failed after its head: what a server can do is cut the response.
    (res as unknown as { destroy(error?: Error): void }).destroy(error as Error);
    return;
  }
  res.end();
}

export async function startStreamServer(
  framework: ServerName,
  plans: Plans,
  options: StreamServerOptions,
): Promise<StreamServer> {
  const runs: Record<string, number> = {};
  const done: Record<string, { promise: Promise<void>; resolve: () => void }> = {};
  const doneOf = (name: string) => {
    let entry = done[name];
    if (entry === undefined) {
      let resolve!: () => void;
      const promise = new Promise<void>((r) => {
        resolve = r;
      });
      entry = { promise, resolve };
      done[name] = entry;
    }
    return entry;
  };
  const started = (name: string, context: IdempotencyContext | undefined): Plan => {
    runs[name] = (runs[name] ?? 0) + 1;
    const plan = plans[name];
    if (plan === undefined) throw new Error(`no plan ${name}`);
    plan.onStart?.(context);
    return plan;
  };
  const idem: HttpIdempotencyOptions<unknown> = {
    store: options.store,
    scope: () => 'tenant-stream',
    storeTimeout: '15s',
    ...(options.onEvent ? { onEvent: options.onEvent } : {}),
    ...options.extra,
  };

  let port: number;
  let closeServer: () => Promise<void>;

  if (framework === 'express' || framework === 'express4') {
    // The alias has no types of its own: it is express@4, whose app has the same surface here.
    const app =
      framework === 'express4' ? ((await import('express4' as string)).default as typeof express)() : express();
    app.post('/stream/:name', expressIdempotency(idem), (req, res, next) => {
      const name = String(req.params.name);
      const plan = started(name, req.idempotency);
      const finish = () => doneOf(name).resolve();
      res.status(plan.status);
      if (plan.headers) res.set(plan.headers);
      if (plan.mode === 'stream') {
        pipeline(Readable.from(plan.chunks?.() ?? []), res, () => finish());
      } else if (plan.mode === 'web' || plan.mode === 'response') {
        pipeline(Readable.fromWeb(webStreamOf(plan, finish)), res, () => undefined);
      } else if (plan.mode === 'writes') {
        writeAll(res, plan).then(finish, finish);
      } else if (plan.mode === 'file') {
        res.sendFile(plan.file as string, () => finish());
      } else {
        joined(plan).then((body) => {
          res.end(body);
          finish();
        }, next);
      }
    });
    app.use(idempotencyErrors());
    const server = app.listen(0, '127.0.0.1');
    await once(server, 'listening');
    port = (server.address() as AddressInfo).port;
    closeServer = async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    };
  } else if (framework === 'fastify') {
    const app = (options.http2 === true ? Fastify({ http2: true }) : Fastify()) as unknown as FastifyInstance;
    const sessions = new Set<Http2Session>();
    if (options.http2 === true) {
      (app.server as unknown as Http2Server).on('session', (session: Http2Session) => {
        sessions.add(session);
        session.once('close', () => sessions.delete(session));
      });
    }
    await app.register(fastifyIdempotency, idem);
    app.post<{ Params: { name: string } }>('/stream/:name', async (request, reply) => {
      const name = request.params.name;
      const plan = started(name, request.idempotency);
      const finish = () => doneOf(name).resolve();
      if (plan.mode === 'writes') {
        reply.hijack();
        reply.raw.writeHead(plan.status, plan.headers ?? {});
        writeAll(reply.raw, plan).then(finish, finish);
        return reply;
      }
      reply.code(plan.status);
      if (plan.headers) reply.headers(plan.headers);
      if (plan.mode === 'buffer') {
        const body = await joined(plan);
        finish();
        return reply.send(body);
      }
      if (plan.mode === 'web') return reply.send(webStreamOf(plan, finish));
      if (plan.mode === 'response') return reply.send(responseOf(plan, finish));
      const stream =
        plan.mode === 'file' ? fs.createReadStream(plan.file as string) : Readable.from(plan.chunks?.() ?? []);
      stream.once('close', finish);
      return reply.send(stream);
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    port = (app.server.address() as AddressInfo).port;
    closeServer = async () => {
      for (const session of sessions) session.destroy();
      if (options.http2 !== true) app.server.closeAllConnections();
      await app.close();
    };
  } else {
    const app = new Koa();
    const handle = koaIdempotency(idem);
    app.use(async (ctx, next) => {
      const match = /^\/stream\/([^/]+)$/.exec(ctx.path);
      if (ctx.method !== 'POST' || match === null) return next();
      await handle(ctx, async () => {
        const name = match[1] as string;
        const plan = started(name, ctx.state.idempotency);
        const finish = () => doneOf(name).resolve();
        if (plan.mode === 'writes') {
          ctx.respond = false;
          ctx.res.writeHead(plan.status, plan.headers ?? {});
          writeAll(ctx.res, plan).then(finish, finish);
          return;
        }
        ctx.status = plan.status;
        if (plan.headers) ctx.set(plan.headers);
        if (plan.mode === 'buffer') {
          ctx.body = await joined(plan);
          finish();
          return;
        }
        if (plan.mode === 'web') {
          ctx.body = webStreamOf(plan, finish);
          return;
        }
        if (plan.mode === 'response') {
          ctx.body = responseOf(plan, finish);
          return;
        }
        const stream =
          plan.mode === 'file' ? fs.createReadStream(plan.file as string) : Readable.from(plan.chunks?.() ?? []);
        stream.once('close', finish);
        ctx.body = stream;
      });
    });
    app.on('error', () => undefined);
    if (options.http2 === true) {
      const server = createH2Server(app.callback());
      const sessions = new Set<Http2Session>();
      server.on('session', (session) => {
        sessions.add(session);
        session.once('close', () => sessions.delete(session));
      });
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
    runs,
    finished: (name) => doneOf(name).promise,
    close: () => closeServer(),
  };
}

/** What a client received: the status, headers, the bytes and whether the message ended well. */
export interface Received {
  status: number;
  headers: IncomingMessage['headers'];
  body: Buffer;
  /** Body bytes received (kept in `body` unless `discard`). */
  length: number;
  /** The message arrived whole ('end'); false when the connection failed or closed mid-body. */
  complete: boolean;
}

export interface PostOptions {
  /** Reads this many bytes, then destroys the connection (the client leaves mid-body). */
  leaveAfter?: number;
  /** Pauses after the head for this long before reading (a slow reader), calling `whilePaused`. */
  whilePaused?: () => Promise<void>;
  /** Gives up (destroying the connection) after this many ms. Default 20 s. */
  timeoutMs?: number;
  /** Counts the body's bytes without keeping them (`body` stays empty). */
  discard?: boolean;
  /** Extra request headers (Accept-Encoding, ...). */
  headers?: Record<string, string>;
  /** Destroys the connection once this settles (the client leaves at a moment the test chooses). */
  leaveWhen?: Promise<unknown>;
}

/** A keyed POST with node:http on a fresh connection. */
export function post(port: number, name: string, key: string, options: PostOptions = {}): Promise<Received> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({
      host: '127.0.0.1',
      port,
      path: `/stream/${name}`,
      method: 'POST',
      agent: false,
      headers: {
        'idempotency-key': key,
        'content-type': 'application/json',
        'content-length': '2',
        ...options.headers,
      },
    });
    const timer = setTimeout(() => req.destroy(new Error('client timed out')), options.timeoutMs ?? 20_000);
    req.on('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
    req.on('response', (res) => {
      const parts: Buffer[] = [];
      let size = 0;
      let settled = false;
      const settle = (complete: boolean) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: Buffer.concat(parts),
          length: size,
          complete,
        });
      };
      res.on('data', (chunk: Buffer) => {
        if (options.discard !== true) parts.push(chunk);
        size += chunk.length;
        if (options.leaveAfter !== undefined && size >= options.leaveAfter) {
          req.destroy();
          settle(false);
        }
      });
      res.on('end', () => settle(res.complete));
      options.leaveWhen?.then(() => {
        req.destroy();
        settle(false);
      });
      res.on('error', () => settle(false));
      res.on('aborted', () => settle(false));
      res.on('close', () => settle(res.complete));
      if (options.whilePaused !== undefined) {
        res.pause();
        options.whilePaused().then(
          () => res.resume(),
          (error) => {
            req.destroy();
            reject(error);
          },
        );
      }
    });
    req.end('{}');
  });
}

// The pattern: the byte at position p is p % 251 (a prime, so no chunk size lines up with it). Filled
// by copying from a tile of whole periods, not byte by byte: the audits send hundreds of MiB of it,
// and a loop per byte took seconds of the streaming audit's run.
const PERIOD = 251;
const tile = Buffer.allocUnsafe(PERIOD * 4096);
for (let i = 0; i < tile.length; i++) tile[i] = i % PERIOD;

/** Fills `target` with the pattern's bytes from position `start` on. */
function fillPattern(target: Buffer, start: number): Buffer {
  for (let at = 0; at < target.length; ) {
    const from = (start + at) % PERIOD;
    const n = Math.min(target.length - at, tile.length - from);
    tile.copy(target, at, from, from + n);
    at += n;
  }
  return target;
}

/** `size` bytes of a repeating, position-dependent pattern, in chunks of `chunk` bytes. */
export function patternChunks(size: number, chunk: number, failAfter?: number): () => AsyncIterable<Buffer> {
  return async function* () {
    let sent = 0;
    while (sent < size) {
      if (failAfter !== undefined && sent >= failAfter) throw new Error('the body source failed');
      const n = Math.min(chunk, size - sent);
      const bytes = fillPattern(Buffer.allocUnsafe(n), sent);
      sent += n;
      yield bytes;
      // Lets the event loop turn, as a real source (a database cursor, a file) would.
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
  };
}

/** The bytes `patternChunks(size, …)` yields. */
export function patternBytes(size: number): Buffer {
  return fillPattern(Buffer.allocUnsafe(size), 0);
}

let collect: (() => void) | undefined;

/**
 * Bytes of ArrayBuffers (Buffers) this process still holds after a full garbage collection: what is
 * retained, not what was allocated and dropped. The collector is reached through V8's flag (set once,
 * for this worker only), so the figure does not depend on when V8 chose to collect.
 */
export function retainedBufferBytes(): number {
  if (collect === undefined) {
    v8.setFlagsFromString('--expose-gc');
    collect = vm.runInNewContext('gc') as () => void;
  }
  collect();
  collect();
  return process.memoryUsage().arrayBuffers;
}

/**
 * The same keyed POST over h2c, on a session of its own. `leaveAfter` cancels the stream
 * (RST_STREAM CANCEL) once that many body bytes arrived: the client leaves mid-body.
 */
export function postH2(port: number, name: string, key: string, options: PostOptions = {}): Promise<Received> {
  return new Promise((resolve, reject) => {
    const session = h2connect(`http://127.0.0.1:${port}`);
    session.on('error', () => undefined);
    const stream = session.request({
      ':method': 'POST',
      ':path': `/stream/${name}`,
      'idempotency-key': key,
      'content-type': 'application/json',
      ...options.headers,
    });
    const parts: Buffer[] = [];
    let size = 0;
    let status = 0;
    let headers: IncomingMessage['headers'] = {};
    let settled = false;
    const timer = setTimeout(() => stream.close(h2constants.NGHTTP2_CANCEL), options.timeoutMs ?? 20_000);
    const settle = (complete: boolean) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      session.close();
      if (status === 0) reject(new Error('no response'));
      else resolve({ status, headers, body: Buffer.concat(parts), length: size, complete });
    };
    stream.on('response', (head) => {
      status = Number(head[':status']);
      headers = head as IncomingMessage['headers'];
    });
    stream.on('data', (chunk: Buffer) => {
      if (options.discard !== true) parts.push(chunk);
      size += chunk.length;
      if (options.leaveAfter !== undefined && size >= options.leaveAfter) {
        stream.close(h2constants.NGHTTP2_CANCEL);
        settle(false);
      }
    });
    stream.on('end', () => settle(stream.rstCode === undefined || stream.rstCode === 0));
    stream.on('error', () => settle(false));
    stream.on('close', () => settle(stream.rstCode === 0 && stream.readableEnded));
    stream.end('{}');
  });
}

/**
 * The retry's answer once the first attempt is settled: a retry that meets the key still in
 * progress (409, the settle racing the client) asks again, as a client honouring Retry-After would.
 * `send` is how it asks (`post`, or `postH2` over HTTP/2).
 */
export async function settledRetry(
  port: number,
  name: string,
  key: string,
  options: PostOptions & { send?: typeof post } = {},
): Promise<Received> {
  const { send = post, ...postOptions } = options;
  const until = Date.now() + 15_000;
  for (;;) {
    const answer = await send(port, name, key, postOptions);
    if (answer.status !== 409 || Date.now() > until) return answer;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Asserts the replayed `500 response_not_replayable` problem of an operation that ran. */
export function expectNotReplayable(answer: Received): void {
  expect(answer.status).toBe(500);
  expect(answer.headers['idempotent-replayed']).toBe('true');
  expect(answer.headers['content-type']).toBe('application/problem+json');
  expect(JSON.parse(answer.body.toString())).toMatchObject({ code: 'response_not_replayable', retryable: false });
}
