// Koa's app.callback() served over HTTP/2 (h2c: `http2.createServer`, the same compatibility API
// `createSecureServer({ allowHTTP1: true })` hands a Koa app for its h2 clients). The middleware
// reads `ctx.req`, an `Http2ServerRequest`, and captures `ctx.res`, an `Http2ServerResponse`.
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import Koa from 'koa';
import { afterEach, expect, it } from 'vitest';
import { h2post } from '../../core/test/support/h2.js';
import { idempotency } from '../src/idempotency.js';

// Loaded by a specifier TypeScript does not follow (see bodyparser.test.ts).
const parserModule: string = '@koa/bodyparser';
const { bodyParser } = (await import(parserModule)) as { bodyParser: () => Koa.Middleware };

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

/** Serves `app` over h2c on an ephemeral port and returns a connected client session. */
async function serveH2(app: Koa): Promise<{ session: http2.ClientHttp2Session; server: http2.Http2Server }> {
  const server = http2.createServer(
    app.callback() as unknown as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const session = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  session.on('error', () => undefined);
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        session.destroy();
        server.close(() => resolve());
      }),
  );
  return { session, server };
}

const json = { 'content-type': 'application/json' };

// Was a defect: over HTTP/2, every keyed POST with a Content-Length reaches the body parser mounted
// after the middleware (@koa/bodyparser, as the Koa guide mounts it) with its stream already ended:
// raw-body throws "stream is not readable" and the client gets 500, the handler never runs (a
// handler reading `ctx.req` itself gets an empty body). The middleware reads the body in paused
// mode and waits for `req.complete` to put the bytes back with `unshift`; an `Http2ServerRequest`
// only turns `complete` once 'end' was emitted, so the read runs to 'end' (endOfBody) and the bytes
// are never put back. Expected: the parser reads the very same bytes "as if nothing had
// happened" (readRequestBody's and the Koa middleware's docs), on HTTP/2 as on HTTP/1.1.
it('HTTP/2 with Content-Length: the body parser after the middleware still gets the body', async () => {
  const seen: unknown[] = [];
  const app = new Koa();
  app.silent = true;
  app.use(idempotency({ store: memoryStore(), scope: () => 'user_1' }));
  app.use(bodyParser());
  app.use((ctx) => {
    seen.push((ctx.request as { body?: unknown }).body);
    ctx.status = 201;
    ctx.body = { ok: true };
  });
  const { session } = await serveH2(app);
  const body = '{"amount":1}';
  const first = await h2post(
    session,
    { ...json, 'idempotency-key': 'h2-cl-1', 'content-length': String(Buffer.byteLength(body)) },
    body,
  );
  expect(first.status).toBe(201);
  expect(seen).toEqual([{ amount: 1 }]);
});

// Was a defect: an HTTP/2 request carries no Content-Length when its client does not know the length
// up front (RFC 9113 8.1.1: the body is framed by DATA frames and END_STREAM; Content-Length is
// optional), and never a Transfer-Encoding (RFC 9113 8.2.2). readRequestBody applies the HTTP/1.1
// rule "neither header: no body" (RFC 9112 6.3) to it, so the body is never read: the key is
// claimed with the fingerprint of an empty body, `maxBodyBytes` is not enforced, and the same key
// sent with another body is answered with the first body's stored response (201, Idempotent-
// Replayed) instead of being refused. Expected: 422 fingerprint_mismatch for a key reused with
// another payload (IETF draft-ietf-httpapi-idempotency-key-header, and the README's guarantee).
it('HTTP/2 without Content-Length: the same key with another body is refused 422, not replayed', async () => {
  let runs = 0;
  const app = new Koa();
  app.use(idempotency({ store: memoryStore(), scope: () => 'user_1' }));
  app.use(bodyParser());
  app.use((ctx) => {
    runs++;
    ctx.status = 201;
    ctx.body = { charged: (ctx.request as { body?: { amount?: number } }).body?.amount };
  });
  const { session } = await serveH2(app);
  const first = await h2post(session, { ...json, 'idempotency-key': 'h2-nocl-1' }, '{"amount":1}');
  expect(first.status).toBe(201);
  const other = await h2post(session, { ...json, 'idempotency-key': 'h2-nocl-1' }, '{"amount":999}');
  expect(other.headers['idempotent-replayed']).toBeUndefined();
  expect(other.status).toBe(422);
  expect(runs).toBe(1);
});

// Was a defect: over HTTP/2, a client that cancels its stream (RST_STREAM: a client-side timeout, an
// aborted fetch) while the handler works gets its operation run twice. The handler finishes and
// sets its 201, but the middleware asks Koa's `ctx.writable`, which on an Http2ServerResponse
// looks at the session's socket (still open) rather than the closed stream, so it takes the
// response for one Koa will write, then gives it up as never ended: the key is released
// (`response-not-stored`, reason `closed`) and the retry with the same key runs the handler again.
// On HTTP/1.1 the same scenario stores the 201 and the retry replays it. Expected: "The outcome is
// stored even if the client disconnects while the handler runs" (docs/guides/koa.md, the capture's
// docs: "a client that timed out finds it when it retries"); exactly one side effect per key.
it('HTTP/2 stream cancelled while the handler works: the outcome is stored and the retry replays it', async () => {
  let runs = 0;
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  let settled!: () => void;
  const settledOnce = new Promise<void>((resolve) => {
    settled = resolve;
  });
  const events: IdempotencyEvent[] = [];
  const app = new Koa();
  app.silent = true;
  app.use(
    idempotency({
      store: memoryStore(),
      scope: () => 'user_1',
      onEvent: (event) => {
        events.push(event);
        if (event.type === 'complete' || event.type === 'release') settled();
      },
    }),
  );
  app.use(async (ctx) => {
    runs++;
    if (runs === 1) {
      // The effect happens after the client has gone: wait for the stream to close.
      const gone = new Promise((resolve) => ctx.req.once('close', resolve));
      started();
      await gone;
    }
    ctx.status = 201;
    ctx.body = { id: `ch_${runs}` };
  });
  const { session } = await serveH2(app);
  const headers = { ...json, 'idempotency-key': 'h2-gone-1', 'content-length': '7' };
  const leaving = session.request({ ':method': 'POST', ':path': '/charges', ...headers });
  leaving.on('error', () => undefined);
  leaving.end('{"a":1}');
  await running;
  leaving.close(http2.constants.NGHTTP2_CANCEL);
  await settledOnce;
  const retry = await h2post(session, headers, '{"a":1}');
  expect(retry.status).toBe(201);
  expect(retry.headers['idempotent-replayed']).toBe('true');
  expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
  expect(runs).toBe(1);
});

// Was a defect (found by a review of the fixes above): over HTTP/2, a Koa request whose client resets its stream mid-upload has the bytes so far
// taken for the whole body: readAvailable checks `req.complete` before `lastBytesIn`, and an
// Http2ServerRequest's `complete` is true once it is aborted or closed, so the truncated body is
// resolved `ok`, the key is claimed with its fingerprint and the outcome stored (the CHANGELOG's
// "a stream reset mid-upload ... is now refused body_incomplete" holds only for Fastify's readStream);
// expected: 400 body_incomplete, a `refused` event, nothing claimed, the honest retry runs.
it('HTTP/2 upload reset midway on Koa: nothing is claimed, the retry with the whole body runs', async () => {
  const events: IdempotencyEvent[] = [];
  const bodies: string[] = [];
  let settled!: () => void;
  const settledOnce = new Promise<void>((resolve) => {
    settled = resolve;
  });
  const app = new Koa();
  app.silent = true;
  app.use(
    idempotency({
      store: memoryStore(),
      scope: () => 'user_1',
      onEvent: (event) => {
        events.push(event);
        if (event.type !== 'claim') settled();
      },
    }),
  );
  app.use(async (ctx) => {
    const chunks: Buffer[] = [];
    for await (const chunk of ctx.req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks).toString();
    bodies.push(body);
    ctx.status = 201;
    ctx.body = { charged: body };
  });
  const server = http2.createServer(
    app.callback() as unknown as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  let received!: () => void;
  const firstBytesIn = new Promise<void>((resolve) => {
    received = resolve;
  });
  server.once('stream', (stream: http2.ServerHttp2Stream) => stream.once('data', () => received()));
  const session = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  session.on('error', () => undefined);
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        session.destroy();
        server.close(() => resolve());
      }),
  );
  const headers = { 'content-type': 'text/plain', 'idempotency-key': 'h2-koa-cut-1' };
  const cut = session.request({ ':method': 'POST', ':path': '/charges', ...headers });
  cut.on('error', () => undefined);
  cut.write('amount=1');
  await firstBytesIn;
  cut.destroy(); // RST_STREAM (CANCEL), no END_STREAM
  await settledOnce;
  expect(events.map((event) => event.type)).not.toContain('claim');
  expect(events).toContainEqual(expect.objectContaining({ type: 'refused', code: 'body_incomplete' }));
  const retry = await h2post(session, headers, 'amount=100');
  expect(retry.status).toBe(201);
  expect(bodies).toEqual(['amount=100']);
});
