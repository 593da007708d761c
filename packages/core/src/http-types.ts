import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { RequestBodyFacts } from './body-refusal.js';
import type { IdempotencyEngine, Lease } from './engine-types.js';
import type { IdempotencyError } from './errors.js';
import type { IdempotencyEvent, NotStoredReason } from './events.js';
import type { BodyRead } from './http-body.js';
import type { StoredResponse } from './store.js';

/**
 * What a handler sees of its own execution: `req.idempotency` (Express), `request.idempotency`
 * (Fastify), `ctx.state.idempotency` (Koa).
 *
 * @example
 * app.post('/charges', (req, res) => res.status(201).json({ key: req.idempotency?.key }));
 */
export interface IdempotencyContext {
  /** The key of this execution (the client's, or the minted one). */
  key: string;
  /** True when the server minted the key (`mintKeys`). */
  minted: boolean;
  /**
   * True when this execution took the key over from an earlier attempt with the same request whose
   * lease ran out unrenewed (its process crashed or hung). That attempt may have done part of the
   * work: a handler with effects outside a transaction can look for them first (downstream calls
   * made with `keyFor` need no such care; their keys are the same on this run).
   */
  readonly recovered: boolean;
  /** The store's transaction in `transactional` mode (for PostgreSQL, a client inside BEGIN), else undefined. */
  tx: unknown;
  /**
   * Aborts when this execution's lease is lost: its renewal was refused (another execution took the
   * key over), none was confirmed for a whole lease, or renewals stopped at `maxExecution`. Another execution may then be
   * running, so a handler that has not made its effect yet should stop; pass it to `fetch`, a
   * database query or a timer.
   */
  readonly signal: AbortSignal;
  /**
   * The idempotency key for a call this execution makes to another service (`purpose` names the call:
   * `'charge'`, `` `refund:${i}` ``). It is the same on every run of this request, a run after a crash
   * or a lost lease too, so the downstream effect happens once; it differs per caller, operation, key,
   * body and purpose. A UUID; see {@link downstreamKey}.
   */
  keyFor(purpose: string): string;
  /**
   * Says that this execution had no effect, so its answer must not be kept: when the response ends
   * it is served but not stored, and the key is released, so a retry runs (a 503 "try again later"
   * answered before anything was written, say). Whatever the outcome policy would decide. In
   * transactional mode the handler's writes roll back, and the response is served as written, but
   * for a live feed (its events are never held) or a body over `maxResponseBytes` (nothing past the
   * limit is held): those are still refused 503. Call it before the response ends; after that it
   * changes nothing. With `advertiseExpiry`, call it before the head
   * goes out too, or the head announces a date (a held response takes it back). Called after the
   * response ended, it warns once (`IDEM_LATE_RELEASE`). Like `keyFor`, it works detached from the
   * context (`const { release } = req.idempotency`).
   *
   * @example
   * app.post('/charges', async (req, res) => {
   *   if (!(await payments.healthy())) {
   *     req.idempotency?.release(); // nothing was charged: the retry must run
   *     return res.status(503).set('Retry-After', '5').json({ error: 'payments_unavailable' });
   *   }
   *   res.status(201).json(await payments.charge(req.body));
   * });
   */
  release(): void;
  /**
   * Says that the answer about to be written is written for the handler, which still runs: a timeout
   * of the app's own that answers 503 while the handler works (a Fastify timer that sends a reply, an
   * Express `setTimeout`, a Koa timeout mounted after `idempotency()` that throws through it). That
   * answer goes out and is never the key's outcome: the handler's own can no longer be written, but
   * the operation ran (or runs), so the key is kept with `500 response_not_replayable` whatever the
   * outcome policy says, and whether or not the timeout's error went through the chain as if the
   * handler threw; a retry never runs the handler again. In transactional mode the transaction rolls
   * back and the key is released instead (`503 store_unavailable`; the retry runs the handler once,
   * whole). Call it just before writing (or throwing) the answer: once said, the next answer is
   * taken as the timeout's, the handler's own too when the timeout then writes nothing (its client
   * reads it, and the key keeps `500 response_not_replayable`). Once the response ended (the
   * handler answered first, its timer firing late) it changes nothing, nor, outside transactional
   * mode, once the handler's head went out (it streams): no other answer can be written then, and
   * the handler's is the outcome. Works detached from the context, like `release`.
   *
   * @example
   * fastify.post('/charges', async (request, reply) => {
   *   const timer = setTimeout(() => {
   *     if (reply.sent) return; // answering already: a second head would throw
   *     request.idempotency?.answeringForHandler();
   *     void reply.code(503).send({ error: 'timeout' });
   *   }, 10_000);
   *   try {
   *     return reply.code(201).send(await payments.charge(request.body));
   *   } finally {
   *     clearTimeout(timer);
   *   }
   * });
   */
  answeringForHandler(): void;
}

/** Per-route settings that override the middleware's (Fastify route `config.idempotency`). */
export interface RouteOverrides {
  required?: boolean | undefined;
  mintKeys?: boolean | undefined;
}

/** A response an adapter writes as is: status, headers (lower case) and body bytes. */
export interface HttpResponse {
  status: number;
  headers: Record<string, string>;
  body: Uint8Array;
  /** A reason phrase of its own (a replay of one the handler set); the status's default when absent. */
  statusMessage?: string | undefined;
}

/** What an adapter knows about a request once its body has been read. */
export interface HttpRequestInfo {
  method: string;
  /** The route template (`/charges/:id`) or, where the framework has not matched one yet, the path. */
  route: string;
  path: string;
  query: string;
  contentType: string | undefined;
  /** The raw `Idempotency-Key` field value(s). */
  keyHeader: string | readonly string[] | undefined;
  /**
   * True when another idem middleware already took this request (its context is on the request, or
   * it ran the request unprotected: `ranUnprotected`): an app-wide instance and a route's own. The
   * first one's claim covers the request; this one steps aside and warns once, instead of claiming
   * the same key again and answering 409 to every request.
   */
  stacked?: boolean | undefined;
  /**
   * The request's `Accept-Encoding`, undefined when it has none: a replay of a body stored
   * compressed is decoded for a retry that does not take its coding (none given means identity, as
   * compression middleware reads it).
   */
  acceptEncoding?: string | undefined;
  /**
   * The raw request body bytes (undefined when there is none), or a reader that `begin` calls only
   * once the key is known to be valid, so a bad key is refused without reading a byte. (The caller is
   * checked after the body, so that an oversized body gets 413 on every adapter, as on Fastify.)
   */
  body: Uint8Array | undefined | (() => Promise<BodyRead>);
  /**
   * The body as the framework's parser left it, for when the raw bytes were never read (Fastify with
   * a JSON body of declared length); used only when `body` is undefined. See {@link parsedBodyRead}.
   */
  json?: unknown;
  /** The caller, from the `scope` option or the default principal; undefined (or empty) when unknown. */
  scope: string | undefined;
  /**
   * The request's headers (Node's `req.headers`), read only for the names in `fingerprint.headers`.
   * Required when that option names any.
   */
  headers?: IncomingHttpHeaders | undefined;
}

/** The outcome of {@link HttpIdempotency.begin}. */
export type HttpBeginResult =
  | {
      kind: 'pass';
      /**
       * Set when the request runs unprotected (`storeUnavailable: 'fail-open'`, the store down): the
       * `Idempotency-Key` response header, as the client sent it. Nothing holds the key. No capture
       * runs for such a request, so the adapter must write it on the response itself, as Express,
       * Fastify and Koa do: one that ignores it sends no key back on an unprotected run.
       */
      echo?: string;
      /**
       * True when the request runs unprotected (`storeUnavailable: 'fail-open'`), a minted key's too.
       * The adapter marks the request (`markUnprotected`) and passes `stacked` for it to a second
       * instance (`ranUnprotected`), which then steps aside rather than try the store again.
       */
      unprotected?: true;
    }
  | { kind: 'respond'; response: HttpResponse }
  | {
      kind: 'execute';
      key: string;
      /** The `Idempotency-Key` response header: the field value as the client sent it, or the minted key. */
      echo: string;
      lease: Lease;
      minted: boolean;
      /**
       * The request body as `begin` read and fingerprinted it (decoded from its `Content-Encoding`),
       * undefined when it read none: what the capture checks a body parser's refusal against
       * (`request` of {@link CaptureOptions}).
       */
      body: Uint8Array | undefined;
    };

/**
 * The result of watching a response: either the complete response (with the headers a replay
 * carries, no others), or why it cannot be stored.
 */
export type CaptureResult =
  | { kind: 'complete'; response: StoredResponse }
  | {
      kind: 'unstorable';
      reason: NotStoredReason;
      status: number;
      /** The `Idempotency-Expires` the client was sent with the response's head, if any. */
      expires?: string;
    };

/** Options of {@link HttpIdempotency.capture}. */
export interface CaptureOptions {
  /**
   * Hold the whole response until `flush()` or `replace()` (transactional mode). A body over
   * `maxResponseBytes` is not held past the limit: what it wrote is dropped, and it can only be replaced.
   */
  hold?: boolean | undefined;
  /** Settle this lease with the outcome; `thrown` is read when the outcome is known. */
  settle?: { lease: Lease; thrown: () => boolean } | undefined;
  /**
   * Asked once, when the response ends (its first `end`): true when no route answered the request,
   * for an adapter that claims the key before it knows (Express and Koa mounted with `app.use`, or
   * an Express route that passes the request on with `next()`). Such an answer (the framework's 404)
   * is no outcome of the operation: stored, it would be replayed for the whole retention, even by a
   * newer instance that has the route (a rolling deploy). It is served as written but not stored:
   * the key is released (reason `'no-route'`), the end leaves only once it is (held: once the
   * transaction has rolled back), and the `Idempotency-Key` echo is taken off it while its head has
   * not gone out.
   *
   * @example
   * http.capture(res, { settle: { lease, thrown }, unrouted: () => res.statusCode === 404 && req.route === undefined });
   */
  unrouted?: (() => boolean) | undefined;
  /**
   * The `Idempotency-Key` echo, put back over whatever the response says under that name when its
   * head leaves: something took it off (Koa's error handler removes every header), or the handler
   * passed on an upstream's key (see ownKeyHeaders). Not on an unrouted answer.
   */
  echo?: string | undefined;
  /**
   * The request, as far as a body parser's refusal is checked against it (see
   * {@link ResponseCapture.failedWith}): its headers and the body `begin` read (`started.body`).
   */
  request?: RequestBodyFacts | undefined;
  /**
   * Whether the handler still runs, for an adapter that can tell (Koa, until its `await next()`
   * settles). A response ended while `running` is true, unless `writesItself()` says the handler
   * wrote it, is an answer written for the handler by someone else (a timeout middleware's 503):
   * it goes out at once and is never the key's outcome. The key stays held (retries get 409) until
   * the adapter sets `running` to false and calls {@link ResponseCapture.handlerSettled}; it is
   * then kept with `500 response_not_replayable` whatever the policy says of the status sent (the
   * operation ran), or released if the handler threw and the policy releases a thrown handler.
   * Checked only when the response ends: an adapter passes an object it keeps per request anyway.
   */
  handler?: RunningHandler | undefined;
}

/** What {@link CaptureOptions.handler} reads: see there. */
export interface RunningHandler {
  /** True until the handler settled; the adapter sets it false, then calls `handlerSettled()`. */
  running: boolean;
  /** True when the handler writes the response itself (Koa's `ctx.respond = false`): its end is its own. */
  writesItself(): boolean;
}

/** A live capture of one response. See {@link HttpIdempotency.capture}. */
export interface ResponseCapture {
  /** Settles once the response ended, or once it is known that it cannot be stored. */
  readonly result: Promise<CaptureResult>;
  /** True once `end` has been called (or the response was completed from the framework's state). */
  readonly ended: boolean;
  /**
   * Completes the capture from a response the framework will never write (Koa skips writing when the
   * client has gone): stored like a written one, or, over `maxResponseBytes`, settled as too large to
   * replay. No-op when the response already ended.
   */
  completeWith(response: StoredResponse): void;
  /**
   * Completes the capture, as `completeWith` does, from the response the framework would have
   * written for what the handler left (Fastify's send for an async handler's undefined, Koa's
   * `respond` from `ctx.body`), for a client gone: the response's reason phrase is taken as a
   * written head takes it, so the record is what a connected client's answer would have made it.
   * That is the handler's own phrase (`statusMessage`), when it set one Node can write; one Node
   * refuses is dropped (see `IDEM_UNWRITABLE_REASON_PHRASE`). A `statusMessage` on `response` is
   * replaced.
   *
   * @example
   * capture.completeAsWritten({ status: reply.statusCode, headers, body: Buffer.alloc(0) });
   */
  completeAsWritten(response: StoredResponse): void;
  /**
   * Gives up on a response without storing it: one the framework will never finish writing (the
   * client left mid-stream, `'streaming'`, the default), whose key the policy keeps or releases as
   * for its status (see {@link HttpIdempotency.settle}), or the 404 of a request no route took
   * (`'no-route'`), which is no outcome of the operation and releases the key. (A response that is
   * written learns the latter from `unrouted` in {@link CaptureOptions}.)
   */
  abandon(status: number, reason?: Extract<NotStoredReason, 'streaming' | 'no-route'>): void;
  /**
   * Tells the capture of an error the framework met while it handled the request (Express hands it
   * to its error middleware, Koa's middleware sees it thrown). When it is a body parser's refusal of
   * the request body, no handler ran: the answer that follows (the parser's 400, 413 or 415) is no
   * outcome of the operation. It is served without the key's echo and not stored, and the key is
   * released (reason `'body-refused'`) before its end leaves, as for a request no route took, so the
   * retry with the body fixed runs, as on Fastify, whose parser answers before the key is claimed.
   * A refusal is an error of body-parser or raw-body (`express.json()`, co-body) with a 4xx status and
   * their `type` (`'entity.parse.failed'`, `'entity.too.large'`, ...), or co-body's parse error
   * with status 400 and the text in `body` (`@koa/bodyparser`, `koa-body`). A parser of your own
   * opts in with both: `ctx.throw(400, 'invalid JSON', { type: 'entity.parse.failed' })`. Any other
   * error changes nothing. True when it was a refusal.
   *
   * The shape is not enough when the capture knows the request (`request` of {@link CaptureOptions}):
   * what the parsers put on their errors (the text they could not parse, the limit, the length, the
   * charset or coding) must be this request's, since raw-body raises the same errors for any stream
   * a handler reads after it did its work, and releasing that key would let a retry run it again.
   *
   * @example
   * try { await next(); } catch (error) { capture.failedWith(error); throw error; }
   */
  failedWith(error: unknown): boolean;
  /**
   * Tells the capture that the handler returned and the framework is writing what it left (Koa's
   * `respond`). A response closed before its head from now on is never ended by the framework. If
   * its client left, the outcome is known all the same: `onClosed(context, capture)` is called then
   * to settle it from what the handler left (`completeWith`, or `abandon` for a stream); the key is
   * released only when it does not, or when the server destroyed the response without a failure
   * (reason `'closed'`; see {@link HttpIdempotency.capture}).
   * Releasing the key of a finished handler would let the retry run it a second time.
   */
  handlerReturned<C>(onClosed?: (context: C, capture: ResponseCapture) => void, context?: C): void;
  /**
   * Tells the capture that the handler of {@link CaptureOptions.handler} settled (set its `running`
   * to false first): an answer written for it while it ran is settled now (see there).
   */
  handlerSettled(): void;
  /**
   * Tells the capture that the answer about to be written is written for a handler that still runs,
   * and whose end the adapter cannot see (Express, told by connect-timeout's error): the answer is
   * never the key's outcome. It is settled when it ends as an operation whose answer cannot be
   * replayed: the key kept with `500 response_not_replayable` whatever the policy says, so the
   * retry never runs the handler a second time. No-op once the response ended.
   */
  answeredForHandler(): void;
  /** Held mode: writes the held response to the client (not one over `maxResponseBytes`: see `hold`). */
  flush(): void;
  /** Held mode: drops the held response and writes `response` instead. */
  replace(response: HttpResponse): void;
}

/** The framework-free half of every adapter. Created once per middleware by {@link createHttpIdempotency}. */
export interface HttpIdempotency<Req> {
  readonly engine: IdempotencyEngine;
  readonly required: boolean;
  readonly mintKeys: boolean;
  readonly maxBodyBytes: number;
  readonly transactional: boolean;
  /** The `scope` option, if any. */
  readonly scope: ((request: Req) => string | undefined) | undefined;
  /** True when requests with this method are covered. */
  covers(method: string): boolean;
  /**
   * The `Idempotency-Key` field values of a Node request, each field apart (what
   * `req.headersDistinct['idempotency-key']` holds, so two fields are refused), or undefined.
   */
  keyHeader(req: IncomingMessage): string | readonly string[] | undefined;
  /** True when a request with this method and key header must be handled (read its body, then call `begin`). */
  handles(method: string, keyHeader: string | readonly string[] | undefined, overrides?: RouteOverrides): boolean;
  /** True when `begin` would refuse this key header (missing where required, or malformed) before reading the body. */
  refusesKey(keyHeader: string | readonly string[] | undefined, overrides?: RouteOverrides): boolean;
  /** Parses the key, checks the scope, fingerprints the request and claims the key. */
  begin(request: HttpRequestInfo, overrides?: RouteOverrides): Promise<HttpBeginResult>;
  /** The context a handler sees of an execution that `begin` started (`req.idempotency` and friends). */
  context(started: Extract<HttpBeginResult, { kind: 'execute' }>): IdempotencyContext;
  /** The problem+json response for an error. */
  problem(error: IdempotencyError): HttpResponse;
  /**
   * The problem+json response for a request refused before its record was looked up (a bad key, no
   * scope, a body over the limit or cut short), reported as a `refused` event. For an adapter that
   * reads the body itself; `begin` reports its own refusals.
   */
  refuse(error: IdempotencyError, request: { method: string; route: string }): HttpResponse;
  /**
   * {@link refuse} with `body_incomplete`: for an adapter whose framework read the body and found it
   * cut short (the same error Express's and Koa's body reads give).
   */
  refuseIncompleteBody(request: { method: string; route: string }): HttpResponse;
  /**
   * The response that replays `stored`; `echo` is the `Idempotency-Key` value to send back. A body
   * stored compressed is decoded when `acceptEncoding` (the retry's field) does not take its coding.
   */
  replay(stored: StoredResponse, echo: string, acceptEncoding?: string): HttpResponse;
  /**
   * Watches `res` (Node's `ServerResponse`, which every framework ends up writing to) and copies what
   * is written: status, body, and the headers a replay carries (the allowlist and `replayHeaders`).
   * Every head it lets out says `Cache-Control: no-store`, whatever its status, unless the response
   * has a Cache-Control already (the handler's own is kept): a shared cache must not hand one
   * caller's answer to another. Never stored, so replays carry their own. With `settle`, the outcome is settled for `settle.lease` as soon as it is known, and
   * the end of the response is held until it is stored: a client that read the whole response and
   * retries at once gets the replay, never a 409. In held mode (`hold: true`, transactional) nothing
   * reaches the client until `flush()` or `replace()`.
   *
   * A response the server destroyed before its head went out can never be ended: it is settled at
   * once, where the heartbeat would otherwise renew its lease for as long as the process lives.
   * Destroyed with an error or after a body stream was piped into it (a failed
   * `stream.pipeline(source, res)`, a framework giving up on a failed body stream), the handler ran
   * and had begun its answer: settled as a stream cut short (reason `'streaming'`), which the
   * default policy keeps as `500 response_not_replayable`. Destroyed without a word
   * (`res.destroy()`), it is not stored and the key released (reason `'closed'`). So is one closed
   * after {@link ResponseCapture.handlerReturned}, unless destroyed by a failure as above. One whose
   * client left may still be ended by a handler that is working, and its outcome is then stored as
   * usual (a client that timed out finds it when it retries); a handler that never ends it is a
   * hanging handler, which `maxExecution` bounds. But one whose client left while a body stream
   * piped into it had yet to give its first chunk is never ended (the pipe or pipeline stops with
   * the close): it is settled at once as a stream cut short, as above (held: rolled back, and the
   * key released).
   */
  capture(res: ServerResponse, options?: CaptureOptions): ResponseCapture;
  /**
   * Settles an execution once its response is known: stores it per the outcome policy, or releases
   * the key. A response that went out but cannot be stored (`too-large`, `streaming`) is judged by
   * the policy as the status it was sent with (`Outcome.unreplayable` says why): stored, the key
   * keeps a `500 response_not_replayable` for its retries; any other unstorable answer releases the
   * key. Never throws; never leaves the record in progress on purpose.
   */
  settle(lease: Lease, result: CaptureResult, thrown: boolean): Promise<void>;
  /**
   * Runs an execution in the store's transaction (`transactional: true`): `start` lets the handler
   * run with the transaction, which commits once the held response is known. `notStarted` is called
   * when the transaction could not begin, after the 503 was written.
   */
  runTransaction(
    lease: Lease,
    capture: ResponseCapture,
    start: (tx: unknown) => void,
    thrown: () => boolean,
    notStarted?: () => void,
  ): Promise<void>;
  /** Reports an adapter event through `onEvent`. */
  emit(event: IdempotencyEvent): void;
}
