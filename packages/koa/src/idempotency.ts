import { STATUS_CODES } from 'node:http';
import type { Readable } from 'node:stream';
import {
  type BodyRead,
  clientLeft,
  createHttpIdempotency,
  destroyedOf,
  foldRoutePath,
  type HttpIdempotencyOptions,
  type HttpResponse,
  headerRecord,
  type IdempotencyContext,
  isLeaseLost,
  markUnprotected,
  originForm,
  type ParsedBodyFields,
  principalScope,
  problemResponse,
  type ResponseCapture,
  ranUnprotected,
  readBodyForFingerprint,
  type StoredResponse,
  writeResponse,
} from '@idem/core';
import type { Principal } from '@idem/guard';
import type { Context, Middleware, Next } from 'koa';
import { anonymousGuardOf, sendGuardError } from './auth-state.js';

declare module 'koa' {
  interface DefaultState {
    /** Set by `idempotency()` while a covered request executes: its key and, in transactional mode, the transaction. */
    idempotency?: IdempotencyContext;
  }
}

/**
 * What idem puts on `ctx.state`. Koa's `DefaultState` carries it already; an app that declares its
 * own state type (`new Koa<MyState>()`, a router's state parameter) adds it so, since Koa then
 * leaves `DefaultState` aside.
 *
 * @example
 * const app = new Koa<{ tenant: string } & IdemState>();
 * app.use((ctx) => { ctx.body = { by: ctx.state.auth?.sub, key: ctx.state.idempotency?.key }; });
 */
export interface IdemState {
  /** The caller, set by `guard()` or `internalAuth()`. */
  auth?: Principal;
  /** The execution's key and context, set by `idempotency()` on a covered request. */
  idempotency?: IdempotencyContext;
}

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

// Koa 3 also writes web bodies itself, as streams: their bytes are not known until they are read.
function isWebBody(body: unknown): body is Blob | ReadableStream | Response {
  return body instanceof Blob || body instanceof ReadableStream || body instanceof Response;
}

// A web body nobody will read: its source is told to stop (a Blob holds nothing to stop).
function cancelWebBody(body: Blob | ReadableStream | Response) {
  const stream = body instanceof Response ? body.body : body instanceof ReadableStream ? body : null;
  if (stream !== null && !stream.locked) stream.cancel().catch(ignore);
}

function ignore() {
  // Cancelling a body nobody reads has nobody to report to.
}

// The response Koa would have written from ctx.body (its `respond`), for when it will not write at
// all. Only bodies whose bytes are known without reading anything: see settleUnwritten.
function responseOf(ctx: Context): StoredResponse {
  const body: unknown = ctx.body;
  const status = ctx.status;
  const headers = headerRecord(ctx.response.headers);
  let bytes: Buffer;
  if (body === null || body === undefined) {
    if (emptyStatuses.has(status) || (ctx.response as { _explicitNullBody?: boolean })._explicitNullBody) {
      bytes = Buffer.alloc(0);
    } else {
      // Koa answers a status without a body with its message as text.
      bytes = Buffer.from(ctx.message || String(status));
      headers['content-type'] = 'text/plain; charset=utf-8';
    }
  } else if (typeof body === 'string') bytes = Buffer.from(body);
  // Only a Buffer is written as bytes: Koa writes any other Uint8Array as JSON, like an object.
  else if (Buffer.isBuffer(body)) bytes = body;
  else bytes = Buffer.from(JSON.stringify(body));
  // Its reason phrase (`ctx.message`) the capture takes as a head would (see settleUnwritten).
  const response: StoredResponse = { status, headers, body: bytes };
  if (!emptyStatuses.has(status)) return response;
  // Koa drops the body of these statuses, and its type with it.
  delete headers['content-type'];
  response.body = Buffer.alloc(0);
  return response;
}

// Statuses Koa always answers without a body.
const emptyStatuses = new Set([204, 205, 304]);

/**
 * Koa's `respond` skips writing when the client has gone, so the capture would never see an end: store
 * what the handler produced instead (the outcome is kept even though nobody reads it). A streamed
 * body (a Node stream, or a Blob, web ReadableStream or Response, which Koa 3 streams too) cannot be
 * known in full, and an error has no body yet: the first is stopped and settled as a stream cut
 * short (the outcome policy keeps its key, by default, with `500 response_not_replayable`), the
 * second is stored as the plain status Koa would have sent. A request no route took is not an outcome at all. With
 * `ctx.respond = false` and no error, the handler writes `ctx.res` itself, maybe later: what it
 * writes is what the capture sees (and a response it destroyed is given up).
 */
function settleUnwritten(ctx: Context, capture: ResponseCapture, error?: unknown) {
  if (capture.ended || !clientGone(ctx) || (error === undefined && ctx.respond === false)) return;
  if (error === undefined && nothingMatched(ctx)) {
    capture.abandon(ctx.status, 'no-route');
    return;
  }
  if (error !== undefined) {
    capture.completeWith(errorResponse(error));
    return;
  }
  const body: unknown = ctx.body;
  if (isStream(body) || isWebBody(body)) {
    if (isStream(body)) body.destroy();
    else cancelWebBody(body);
    capture.abandon(ctx.status);
    return;
  }
  let response: StoredResponse;
  try {
    response = responseOf(ctx);
  } catch {
    // A body JSON cannot write (a BigInt, a cycle): Koa's respond would have thrown too and answered
    // 500. This may run in the response's 'close' listener, where a throw would end the process.
    capture.completeWith(plainStatus(500));
    return;
  }
  // With the reason phrase Koa's head would have carried: the handler's own (`ctx.message`).
  capture.completeAsWritten(response);
}

// The plain text answer Koa writes for an error of this status.
function plainStatus(status: number): StoredResponse {
  return {
    status,
    headers: { 'content-type': 'text/plain; charset=utf-8' },
    body: Buffer.from(STATUS_CODES[status] ?? String(status)),
  };
}

/**
 * The answer Koa's `ctx.onerror` writes for an error no middleware caught, for a client that stayed:
 * `err.status || err.statusCode` when it is a number Koa knows a message for (else 500), the error's
 * message as the body when it is exposed (http-errors' 4xx, `ctx.throw(409, 'card taken')`) or the
 * status's text, and the error's own `headers` but its content type and length. Something thrown
 * that is no Error Koa replaces with one, so a plain 500. Stored otherwise for a client gone, the
 * retry would get another answer than the one a client that stayed got.
 */
function errorResponse(error: unknown): StoredResponse {
  if (!(error instanceof Error || Object.prototype.toString.call(error) === '[object Error]')) return plainStatus(500);
  const { status: given, statusCode, expose, message, headers: own } = error as Error & Record<string, unknown>;
  const candidate = given || statusCode;
  const status = typeof candidate === 'number' && STATUS_CODES[candidate] !== undefined ? candidate : 500;
  const response = plainStatus(status);
  if (expose && typeof message === 'string') response.body = Buffer.from(message);
  if (own !== null && typeof own === 'object') {
    const headers = headerRecord(own as Record<string, unknown>);
    delete headers['content-length'];
    response.headers = { ...headers, 'content-type': 'text/plain; charset=utf-8' };
  }
  return response;
}

/**
 * True when no route took the request, so its 404 is no outcome of the operation: stored, it would
 * be replayed for the whole retention, even by a newer instance that has the route (a rolling
 * deploy). Either nothing set a status or a body (Koa's own 404), or @koa/router saw the request
 * (`ctx.router`) and matched no route (no `ctx._matchedRoute`), so whatever answered 404, or 405 and
 * 501 from its `allowedMethods()`, answered for no route. A 404 a route's handler set, or one a
 * handler threw, is an answer and is stored. So is Koa's own 404 after a route @koa/router matched:
 * a route that passed the request on (`await next()`) and one that did its work but set no body
 * leave the context alike, and releasing the key of the second would let a retry do the work again.
 */
function nothingMatched(ctx: Context): boolean {
  const routed = ctx as { _matchedRoute?: unknown; router?: unknown };
  if (routed._matchedRoute !== undefined || ctx.respond === false) return false;
  const status = ctx.status;
  if (status === 404 && ctx.body == null && !(ctx.response as { _explicitStatus?: boolean })._explicitStatus) {
    return true;
  }
  return routed.router !== undefined && (status === 404 || status === 405 || status === 501);
}

/**
 * The template of the route @koa/router runs for this request, when it routed it. `ctx._matchedRoute`
 * names the layer running now: on a route, that route. Mounted with `router.use()`, though, it names
 * the use layer (`/v1(?:\/|$)` on a prefixed router, `/v1` for `use('/v1', ...)`), which every route
 * under it shares. `ctx.matched` lists every layer whose path matches, in order, whatever its method
 * (a catch-all after the route too, which runs only if the route passes the request on): the route
 * that runs next is the first one of this method after the use layer.
 */
function routeTemplateOf(ctx: Context): string | undefined {
  const routed = ctx as { matched?: unknown; _matchedRoute?: unknown };
  const current = routed._matchedRoute;
  if (!Array.isArray(routed.matched) || typeof current !== 'string') {
    return typeof current === 'string' ? current : undefined;
  }
  const layers = routed.matched as Array<{ path?: unknown; methods?: unknown }>;
  const at = layers.findIndex((layer) => layer.path === current);
  const running = layers[at];
  // A route layer (it has methods): the route itself.
  if (running === undefined || !Array.isArray(running.methods) || running.methods.length > 0) return current;
  for (let i = at + 1; i < layers.length; i++) {
    const layer = layers[i] as { path?: unknown; methods?: unknown };
    if (Array.isArray(layer.methods) && layer.methods.includes(ctx.method) && typeof layer.path === 'string') {
      return layer.path;
    }
  }
  return current;
}

/**
 * The operation's route: the template @koa/router matched, after the prefix a mount took off (a
 * router knows nothing of it), or else the whole path, folded as @koa/router matches paths.
 */
function routeOf(ctx: Context, mounted: string, path: string): string {
  const template = routeTemplateOf(ctx);
  return template === undefined ? foldRoutePath(path, koaRouting) : mounted + template;
}

/**
 * The path prefix a mount took off `ctx.path` (koa-mount runs a mounted app with `/v1/charges` as
 * `/charges`, and `/v1` as `/`), or `''`. Express keeps its mount path in the operation
 * (`req.baseUrl`) and Fastify a plugin's prefix in the route: without it here, apps mounted at `/v1`
 * and `/v2` on one store would both name `POST /charges`, and a key sent to `/v2/charges` would
 * replay `/v1/charges`. Read from `ctx.originalUrl`, which no mount changes: the part of its path
 * before `ctx.path`. (A rewrite that changed the whole path leaves no such prefix: nothing is added.)
 */
function mountPrefixOf(ctx: Context, rest: string): string {
  const original = ctx.originalUrl;
  if (typeof original !== 'string') return '';
  // Its path alone, also of a target in absolute form (`http://host/v1/charges`, proxies send it).
  const target = originForm(original);
  const query = target.indexOf('?');
  const whole = query === -1 ? target : target.slice(0, query);
  if (whole === rest) return '';
  // koa-mount gives the mount point itself (`/v1`, `/v1/`) as `/`.
  if (rest === '/') return whole.endsWith('/') ? whole.slice(0, -1) : whole;
  return whole.length > rest.length && whole.endsWith(rest) && whole[whole.length - rest.length - 1] !== '/'
    ? whole.slice(0, whole.length - rest.length)
    : '';
}

// `ctx.path` as a path: koa-mount with a prefix that ends in a slash (`/v1/`) runs the mounted app
// with `charges` for `/v1/charges`, without the leading slash.
function pathInMount(ctx: Context): string {
  const path = ctx.path;
  return path.startsWith('/') ? path : `/${path}`;
}

/**
 * One execution: whether its handler threw, and whether it still runs (`await next()` not settled),
 * which the capture asks only when the response ends (see `RunningHandler`).
 */
interface Execution {
  thrown: boolean;
  running: boolean;
  readonly ctx: Context;
  writesItself(this: Execution): boolean;
}

// A handler that took the response over (`ctx.respond = false`) writes its own answer, maybe before
// it returns: that end is its outcome. Any other end before `next()` settled is Koa answering for
// someone else (a timeout racing the chain from above this middleware, its 503 thrown to Koa).
function respondsItself(this: Execution): boolean {
  return this.ctx.respond === false;
}

// Shared and bound to each execution, rather than a closure made per request.
function threw(this: Execution): boolean {
  return this.thrown;
}

// Runs the rest of the chain; whatever happens, the capture learns the outcome even when Koa will
// not write the response.
async function runNext(
  ctx: Context,
  next: Next,
  capture: ResponseCapture,
  execution: Execution,
  held: boolean,
): Promise<void> {
  try {
    await next();
  } catch (error) {
    // Set before Koa's error response is written, so the policy knows the handler threw. A body
    // parser's refusal (@koa/bodyparser, koa-body) means no handler ran: its 400 is no outcome.
    execution.thrown = true;
    capture.failedWith(error);
    if (held) endedWhileHeld(ctx, capture);
    // An answer Koa wrote for the chain while it ran (a timeout above) is settled now that it ended.
    execution.running = false;
    capture.handlerSettled();
    if (clientGone(ctx)) settleAtLastStep(ctx, capture);
    else capture.handlerReturned();
    // A handler that stopped on its lost lease (`signal.throwIfAborted()`) did what it should: its
    // client is told to retry (503, Retry-After), as for idem's own refusals, not shown a bug.
    if (!ctx.headerSent && !clientGone(ctx) && isLeaseLost(error, (ctx.state as IdemState).idempotency)) {
      answer(ctx, problemResponse(error));
      return;
    }
    throw error;
  }
  execution.running = false;
  capture.handlerSettled();
  if (held) endedWhileHeld(ctx, capture);
  if (clientGone(ctx)) {
    settleAtLastStep(ctx, capture);
    return;
  }
  // Koa writes the response now, from what the chain left (its `respond`), unless the handler took
  // it over. Middleware above may still be working (a session saved, a log flushed), and a client
  // that leaves meanwhile makes Koa skip the write: the outcome is then stored from what the chain
  // left, as when it left before. A body stream that failed before its first chunk (Koa destroys
  // the response with its error) is settled at once as a stream cut short: the handler ran.
  if (ctx.respond !== false) capture.handlerReturned(settleUnwritten, ctx);
}

// Held (transactional mode), an end the handler wrote on `ctx.res` itself, without taking the
// response over (`ctx.respond = false`), has not reached Node: Koa, which leaves a response already
// ended alone, would write its own over it (its respond from ctx.body, or its error answer), and the
// client read a body without a head, the connection then cut. Koa is told what Node would tell it:
// nothing more to write, the head gone (what its error handler and middleware above read).
function endedWhileHeld(ctx: Context, capture: ResponseCapture) {
  if (!capture.ended || ctx.respond === false) return;
  ctx.respond = false;
  Object.defineProperty(ctx, 'headerSent', { value: true, configurable: true, enumerable: true });
}

// Koa's `ctx.writable` asks the socket: over HTTP/2, that is the session's, still open when the
// client reset only its stream, which `destroyedOf` sees.
const clientGone = (ctx: Context) => !ctx.writable || destroyedOf(ctx.res);

/**
 * The client left while the chain below ran, so Koa will write nothing, and the outcome is stored
 * from what Koa would have written. That is known only once the middleware above has run too: an
 * error handler turns a throw into its own answer, a wrapper puts the body in an envelope. So it is
 * settled at Koa's last step: `respond` (whose first read is `ctx.respond`), or `ctx.onerror` for
 * an error no middleware caught, which Koa answers with its plain status.
 */
function settleAtLastStep(ctx: Context, capture: ResponseCapture) {
  let respond: unknown = ctx.respond;
  const inherited = ctx.onerror;
  let settled = false;
  const settle = (error?: unknown) => {
    if (settled) return;
    settled = true;
    Object.defineProperty(ctx, 'respond', { value: respond, writable: true, configurable: true, enumerable: true });
    ctx.onerror = inherited;
    settleUnwritten(ctx, capture, error);
    if (error !== undefined) capture.handlerReturned();
    else if (ctx.respond !== false) capture.handlerReturned(settleUnwritten, ctx);
  };
  Object.defineProperty(ctx, 'respond', {
    configurable: true,
    enumerable: true,
    get() {
      settle();
      return respond;
    },
    set(value: unknown) {
      respond = value;
    },
  });
  ctx.onerror = (error: unknown) => {
    // A socket's own error (the client's reset, reported by on-finished) is no answer of the app.
    if (error != null && !isSocketError(error)) settle(error);
    return inherited.call(ctx, error as Error);
  };
}

const isSocketError = (error: unknown) => {
  const code = (error as { code?: unknown }).code;
  return code === 'ECONNRESET' || code === 'EPIPE' || code === 'ECONNABORTED' || code === 'ERR_STREAM_PREMATURE_CLOSE';
};

// How @koa/router compares paths by default: case-insensitive, the trailing slash optional.
const koaRouting = Object.freeze({ caseSensitive: false, strict: false });

// Shared by every request (bound to it), rather than a closure made per request.
function readBody(this: Context, maxBytes: number): Promise<BodyRead> {
  return readBodyForFingerprint(this.req, maxBytes, this.request as ParsedBodyFields);
}

/**
 * Koa 3.1+ middleware (earlier Koa answers a failing body stream itself) that makes covered requests (POST and PATCH by default) safe to retry with
 * an `Idempotency-Key`. The execution's key (and, in transactional mode, the transaction) is on
 * `ctx.state.idempotency`.
 *
 * Order: after the guard (the default scope is `ctx.state.auth`), before the body parser: it reads
 * `ctx.req` itself and puts the bytes back, so @koa/bodyparser, koa-body or multer read them as usual.
 * After a parser, it falls back to `ctx.request.rawBody` or the parsed `ctx.request.body`, and
 * `maxBodyBytes` is then the parser's limit. With @koa/router in front of it, the operation is the
 * route template (`ctx._matchedRoute`); otherwise, the concrete path, spelled as @koa/router matches
 * it by default (lower case, without a trailing slash). A request no route took (Koa's own 404, or
 * one @koa/router matched nothing for) leaves no record: the key is released.
 *
 * @example
 * import Koa from 'koa';
 * import { memoryStore } from '@idem/core';
 * import { idempotency } from '@idem/koa';
 *
 * const app = new Koa();
 * // No guard here, so `scope` says who is calling: everyone is 'demo'. A real app mounts the guard
 * // first and drops `scope`, so each key is scoped by the authenticated caller.
 * app.use(idempotency({ store: memoryStore(), scope: () => 'demo' }));
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
    // An anonymous write (an optional guard let it through) has no caller to scope its key to: it is
    // answered as that guard answers a request without a token, not as a server without a scope.
    // Stacked behind another instance, this one steps aside (begin says so), whatever its scope: one
    // that claimed (its context) or ran the request unprotected (its mark).
    const stacked = ctx.state.idempotency !== undefined || ranUnprotected(ctx);
    const anonymous = http.scope === undefined && !stacked ? anonymousGuardOf(ctx) : undefined;
    if (anonymous !== undefined) return sendGuardError(ctx, anonymous.error('token_missing'));
    const rest = pathInMount(ctx);
    const mounted = mountPrefixOf(ctx, rest);
    const path = mounted + rest;
    const started = await http.begin({
      method: ctx.method,
      stacked,
      route: routeOf(ctx, mounted, path),
      path,
      query: ctx.querystring,
      contentType: ctx.get('content-type') || undefined,
      keyHeader,
      acceptEncoding: ctx.req.headers['accept-encoding'],
      // Read only once the key passed (a bad key costs no body read), before the caller is checked.
      body: readBody.bind(ctx, http.maxBodyBytes),
      scope: http.scope ? http.scope(ctx) : principalScope(ctx.state?.auth),
      headers: ctx.req.headers,
    });
    if (started.kind === 'pass') {
      // Run unprotected (fail-open): the client's key is still echoed.
      if (started.echo !== undefined) ctx.set('Idempotency-Key', started.echo);
      if (started.unprotected) markUnprotected(ctx);
      return next();
    }
    if (started.kind === 'respond') return answer(ctx, started.response);
    const { lease } = started;
    // The client left while the claim waited: no handler for nobody (see clientLeft).
    if (clientGone(ctx) || clientLeft(ctx.req, ctx.res)) {
      ctx.respond = false;
      await http.engine.release(lease);
      return;
    }
    ctx.set('Idempotency-Key', started.echo);
    const context: IdempotencyContext = http.context(started);
    ctx.state.idempotency = context;
    const execution: Execution = { thrown: false, running: true, ctx, writesItself: respondsItself };
    // Koa writes the response after the middleware returned, so what it is only shows at its end:
    // whether a route took the request at all, and whether Koa's error handler, which removes every
    // header, removed the key's echo with them (the client must learn the key its 500 sits under,
    // minted ones above all). The capture puts the echo back on the response rather than on the
    // error's `headers`: an error object may be shared by concurrent requests, and a thrown
    // non-Error is replaced by Koa before it reads them.
    const unrouted = nothingMatched.bind(undefined, ctx);
    const echo = started.echo;
    // What a body parser's refusal, thrown through this middleware, must be about to release the key.
    const request = { headers: ctx.req.headers, body: started.body };
    const capture = http.capture(
      ctx.res,
      http.transactional
        ? { hold: true, unrouted, echo, request, handler: execution }
        : { settle: { lease, thrown: threw.bind(execution) }, unrouted, echo, request, handler: execution },
    );
    if (!http.transactional) return runNext(ctx, next, capture, execution, false);
    // The handler must run inside the transaction, whose callback waits for the response that Koa
    // writes after this middleware returns: so the middleware returns from within the callback.
    await new Promise<void>((resolve, reject) => {
      void http.runTransaction(
        lease,
        capture,
        (tx) => {
          context.tx = tx;
          runNext(ctx, next, capture, execution, true).then(resolve, reject);
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
