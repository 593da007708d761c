import { STATUS_CODES } from 'node:http';
import type { Readable } from 'node:stream';
import {
  type BodyRead,
  createHttpIdempotency,
  type HttpIdempotencyOptions,
  type HttpResponse,
  type IdempotencyContext,
  type ParsedBodyFields,
  principalScope,
  type ResponseCapture,
  readBodyForFingerprint,
  type StoredResponse,
  writeResponse,
} from '@idem/core';
import type { Context, Middleware, Next } from 'koa';

/** Options of the Koa {@link idempotency} middleware: the core's options plus the HTTP ones. */
export type KoaIdempotencyOptions = HttpIdempotencyOptions<Context>;

// Problems and replays bypass Koa's body handling, so they are the same bytes in every adapter.
function answer(ctx: Context, response: HttpResponse) {
  ctx.respond = false;
  writeResponse(ctx.res, response);
}

function isStream(body: unknown): body is Readable {
  return body !== null && typeof body === 'object' && typeof (body as Readable).pipe === 'function';
}

function headersOf(ctx: Context): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(ctx.response.headers)) {
    if (value !== undefined) out[name.toLowerCase()] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return out;
}

// The response Koa would have written from ctx.body, for when it will not write at all.
function responseOf(ctx: Context): StoredResponse {
  const body: unknown = ctx.body;
  let bytes: Buffer;
  if (body === null || body === undefined) bytes = Buffer.alloc(0);
  else if (typeof body === 'string') bytes = Buffer.from(body);
  else if (body instanceof Uint8Array) bytes = Buffer.from(body);
  else bytes = Buffer.from(JSON.stringify(body));
  return { status: ctx.status, headers: headersOf(ctx), body: bytes };
}

/**
 * Koa's `respond` skips writing when the client has gone, so the capture would never see an end: store
 * what the handler produced instead (the outcome is kept even though nobody reads it). A streamed
 * body cannot be known in full, and an error has no body yet: the first is given up, the second is
 * stored as the plain status Koa would have sent.
 */
function settleUnwritten(ctx: Context, capture: ResponseCapture, error?: unknown) {
  if (capture.ended || ctx.writable) return;
  if (error !== undefined) {
    const status = Number((error as { status?: unknown }).status) || 500;
    capture.completeWith({
      status,
      headers: { 'content-type': 'text/plain; charset=utf-8' },
      body: Buffer.from(STATUS_CODES[status] ?? String(status)),
    });
    return;
  }
  if (isStream(ctx.body)) {
    ctx.body.destroy();
    capture.abandon(ctx.status);
    return;
  }
  capture.completeWith(responseOf(ctx));
}

interface Execution {
  thrown: boolean;
}

// Shared and bound to each execution, rather than a closure made per request.
function threw(this: Execution): boolean {
  return this.thrown;
}

// Runs the rest of the chain; whatever happens, the capture learns the outcome even when Koa will
// not write the response.
async function runNext(ctx: Context, next: Next, capture: ResponseCapture, execution: Execution): Promise<void> {
  try {
    await next();
  } catch (error) {
    // Set before Koa's error response is written, so the policy knows the handler threw.
    execution.thrown = true;
    settleUnwritten(ctx, capture, error);
    throw error;
  }
  settleUnwritten(ctx, capture);
}

// Shared by every request (bound to it), rather than a closure made per request.
function readBody(this: Context, maxBytes: number): Promise<BodyRead> {
  return readBodyForFingerprint(this.req, maxBytes, this.request as ParsedBodyFields);
}

/**
 * Koa 3 middleware (it uses nothing Koa 2 lacks) that makes covered requests (POST and PATCH by default) safe to retry with
 * an `Idempotency-Key`. The execution's key (and, in transactional mode, the transaction) is on
 * `ctx.state.idempotency`.
 *
 * Order: after the guard (the default scope is `ctx.state.auth`), before the body parser: it reads
 * `ctx.req` itself and puts the bytes back, so @koa/bodyparser, koa-body or multer read them as usual.
 * After a parser, it falls back to `ctx.request.rawBody` or the parsed `ctx.request.body`, and
 * `maxBodyBytes` is then the parser's limit. With @koa/router in front of it, the operation is the
 * route template (`ctx._matchedRoute`); otherwise, the concrete path.
 *
 * @example
 * import Koa from 'koa';
 * import { memoryStore } from '@idem/core';
 * import { idempotency } from '@idem/koa';
 *
 * const app = new Koa();
 * app.use(idempotency({ store: memoryStore() }));
 * app.use(async (ctx) => {
 *   ctx.status = 201;
 *   ctx.body = { id: 'ch_1' };
 * });
 */
export function idempotency(options: KoaIdempotencyOptions): Middleware {
  const http = createHttpIdempotency<Context>(options);

  return async function idempotencyMiddleware(ctx, next) {
    const keyHeader = http.keyHeader(ctx.req);
    if (!http.handles(ctx.method, keyHeader)) return next();
    const matched = (ctx as { _matchedRoute?: unknown })._matchedRoute;
    const started = await http.begin({
      method: ctx.method,
      route: typeof matched === 'string' ? matched : ctx.path,
      path: ctx.path,
      query: ctx.querystring,
      contentType: ctx.get('content-type') || undefined,
      keyHeader,
      // Read only once the key and the caller passed: a bad key costs no body read.
      body: readBody.bind(ctx, http.maxBodyBytes),
      scope: http.scope ? http.scope(ctx) : principalScope(ctx.state?.auth),
    });
    if (started.kind === 'pass') return next();
    if (started.kind === 'respond') return answer(ctx, started.response);
    const { lease } = started;
    ctx.set('Idempotency-Key', started.echo);
    const context: IdempotencyContext = http.context(started);
    ctx.state.idempotency = context;
    const execution: Execution = { thrown: false };
    const capture = http.capture(
      ctx.res,
      http.transactional ? { hold: true } : { settle: { lease, thrown: threw.bind(execution) } },
    );
    if (!http.transactional) return runNext(ctx, next, capture, execution);
    // The handler must run inside the transaction, whose callback waits for the response that Koa
    // writes after this middleware returns: so the middleware returns from within the callback.
    await new Promise<void>((resolve, reject) => {
      void http.runTransaction(
        lease,
        capture,
        (tx) => {
          context.tx = tx;
          runNext(ctx, next, capture, execution).then(resolve, reject);
        },
        threw.bind(execution),
        () => {
          // The transaction never started: the 503 is written, Koa must not answer too.
          ctx.respond = false;
          resolve();
        },
      );
    });
  };
}
