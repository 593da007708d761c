import type { IncomingHttpHeaders, IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { Http2ServerRequest } from 'node:http2';
import type { Readable } from 'node:stream';
import {
  isBodyRefusal,
  markDecoded,
  markUndecodable,
  type RequestBodyFacts,
  refusesRequestBody,
} from './body-refusal.js';
import { decoderOf, negotiatedBody } from './content-coding.js';
import { downstreamKey } from './downstream-key.js';
import {
  engineFrom,
  engineOptionNames,
  type IdempotencyEngine,
  type IdempotencyOptions,
  type Lease,
  type SettleNow,
  settleNow,
} from './engine.js';
import { IdempotencyError, isIdempotencyError, isStoreUnavailableError, isTransactionAbortedError } from './errors.js';
import type { IdempotencyEvent, NotStoredReason, RefusalCode } from './events.js';
import {
  checkExcludes,
  type FingerprintOptions,
  fingerprintRequest,
  isJsonContentType,
  type RequestParts,
} from './fingerprint.js';
import { isFieldValue } from './header-syntax.js';
import { parseIdempotencyKey } from './key.js';
import { mintKey } from './mint.js';
import { notify } from './notify.js';
import { assertKnownOptions, type ListsEvery } from './option-names.js';
import { type Awaitable, isPending, type StoredResponse } from './store.js';
import { sizeOverLimit } from './stored-response.js';

/**
 * Options shared by the Express, Fastify and Koa adapters: the engine's options plus the HTTP ones.
 * `Req` is the framework's request object (`req`, `request` or `ctx`), as seen by `scope`.
 */
export interface HttpIdempotencyOptions<Req> extends IdempotencyOptions {
  /** Answer 400 when a covered request has no key. Default true. With false, such requests pass through untouched. */
  required?: boolean | undefined;
  /** Methods that are covered. Default `['POST', 'PATCH']`: PUT and DELETE are idempotent by definition (spec part 1). */
  methods?: readonly string[] | undefined;
  /**
   * Who is calling, as a string; requests with different scopes never share a record. Default: the
   * principal the guard attached (`sub` and `iss` of `req.auth`, `request.auth` or `ctx.state.auth`).
   * Return `undefined` (or `''`) when there is no caller: the request is refused with 500 `scope_missing`.
   */
  scope?: ((request: Req) => string | undefined) | undefined;
  /** Mint a key for a covered request that has none and return it in `Idempotency-Key` (spec part 3, rule 3). Default false. */
  mintKeys?: boolean | undefined;
  /** Largest request body hashed, in bytes; larger bodies get 413 before any hashing or claim. Default 1 MiB. */
  maxBodyBytes?: number | undefined;
  /** Largest response body stored, in bytes; larger responses are served but not stored. Default 1 MiB. */
  maxResponseBytes?: number | undefined;
  /** Response headers replayed on top of the built-in allowlist (lower or mixed case). */
  replayHeaders?: readonly string[] | undefined;
  /** Run the handler inside the store's transaction and hold the response until it commits. Default false. */
  transactional?: boolean | undefined;
  /** Accept only RFC 9651 sf-string keys (`"abc"`). Default false. */
  strictKeys?: boolean | undefined;
  /**
   * What the request's identity leaves out or takes in besides method, route, path, query, media
   * type and body: `{ exclude: ['/sentAt'] }` (JSON Pointers of volatile body fields), `{ headers:
   * ['api-version'] }` (request headers whose values are part of it). While changing either on a live
   * service, list the settings it had in `previous`.
   */
  fingerprint?: HttpFingerprintOptions | undefined;
  /**
   * Tell the client how long its key is kept: a first execution whose outcome the policy stores gets
   * `Idempotency-Expires` (an HTTP-date, as `Expires` has it) when its head goes out, and its replays
   * carry the same value. The date is the server's clock plus the outcome's retention, rounded down
   * to the second; the store counts the retention from the completion, by its own clock, so a retry
   * with the key until then replays (barring clock skew between the two). Default false.
   */
  advertiseExpiry?: boolean | undefined;
}

/** What the HTTP layer's fingerprint covers: {@link FingerprintOptions} and request headers. */
export interface HttpFingerprintSettings extends FingerprintOptions {
  /**
   * Request headers whose values are part of the request's identity, by name (any case): an API
   * version (`'api-version'`, `'stripe-version'`), a tenant or account switch. The same key sent
   * with another value is another request (422); an absent header and an empty one are alike.
   * Headers that change from one attempt to the next are refused at construction (a `TypeError`):
   * credentials (`authorization`, `cookie`, `dpop`), the key itself, per-attempt ids and trace
   * context, dates, signatures over a fresh timestamp (`webhook-signature`, `stripe-signature`,
   * `signature`), retry counters (`x-envoy-attempt-count`), and framing (`content-length`,
   * `transfer-encoding`), since every honest retry would be refused 422.
   */
  headers?: readonly string[] | undefined;
}

/** The fingerprint options of the HTTP layer: what it covers, and what it covered before. */
export interface HttpFingerprintOptions extends HttpFingerprintSettings {
  /**
   * The settings (`exclude`, `headers`) the service had before a change of them, for as long as
   * records made under them may be retried: one retention after the change, then remove them.
   * Changing `exclude` or `headers` changes every request's fingerprint, so without them every retry
   * of a request stored before the change is refused 422 `fingerprint_mismatch` for the whole
   * retention, though it was sent byte for byte the same. When a record's fingerprint is not the
   * request's, the request is fingerprinted again under each of these (only then: a match costs
   * nothing more), and one that gives the record's is the same request: replayed, answered 409
   * while in progress, or taken over when abandoned (the record keeps its fingerprint, so instances
   * still on the old settings match it too). Each is checked at construction as the current
   * settings are. The request headers any of them names are read as `headers` are.
   *
   * @example
   * // `/sentAt` is excluded now; before, the service had no fingerprint option.
   * const fingerprint: HttpFingerprintOptions = { exclude: ['/sentAt'], previous: [{}] };
   */
  previous?: readonly HttpFingerprintSettings[] | undefined;
}

// Every name HttpIdempotencyOptions adds to the engine's; the type check keeps the list complete.
const httpOptionNames = [
  'required',
  'methods',
  'scope',
  'mintKeys',
  'maxBodyBytes',
  'maxResponseBytes',
  'replayHeaders',
  'transactional',
  'strictKeys',
  'fingerprint',
  'advertiseExpiry',
] as const satisfies readonly (keyof HttpIdempotencyOptions<unknown>)[];
const everyHttpOptionNamed: ListsEvery<
  HttpIdempotencyOptions<unknown>,
  [...typeof engineOptionNames, ...typeof httpOptionNames]
> = true;
void everyHttpOptionNamed;
const knownHttpOptions: ReadonlySet<string> = new Set([...engineOptionNames, ...httpOptionNames]);
const knownFingerprintSettings: ReadonlySet<string> = new Set<keyof HttpFingerprintSettings>(['exclude', 'headers']);
const knownFingerprintOptions: ReadonlySet<string> = new Set<keyof HttpFingerprintOptions>([
  'exclude',
  'headers',
  'previous',
]);

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
   * True when another idem middleware already took this request (its context is on the request): an
   * app-wide instance and a route's own. The first one's claim covers the request; this one steps
   * aside and warns once, instead of claiming the same key again and answering 409 to every request.
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
  | { kind: 'pass' }
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

/**
 * Headers a replay carries when the handler set them; the user adds more with `replayHeaders`. The
 * last two are ones a status requires (RFC 9110): `Content-Range` in a 206, `Allow` in a 405. They
 * describe the stored answer, not the request.
 */
export const defaultReplayHeaders = [
  'content-type',
  'content-encoding',
  'content-language',
  // The file name of a download (RFC 6266): it describes the stored body, as the type does.
  'content-disposition',
  'location',
  'content-location',
  'etag',
  'last-modified',
  'link',
  'vary',
  'content-range',
  'allow',
] as const;

// Per-request or per-client headers: replaying them would hand one response's cookie, date, quota
// or trace id to another request; and fields about one connection (`upgrade`, `te`, ...), which an
// HTTP/2 retry could not even be sent. They are refused even when listed in `replayHeaders`. Rate
// limits in both spellings (`X-RateLimit-*`, and `X-Rate-Limit-*` as Twitter and many APIs write
// it); request ids and trace context as the usual tracers and platforms answer them (W3C's
// `traceresponse`, AWS, Google Cloud, Zipkin's B3, Jaeger, Datadog, Sentry, Cloudflare's `CF-Ray`).
const neverReplayed =
  /^(set-cookie|date|age|expires|content-length|transfer-encoding|connection|keep-alive|proxy-connection|upgrade|te|http2-settings|idempotency-key|idempotent-replayed|cache-control|x-request-id|request-id|x-correlation-id|x-amzn-requestid|x-amz-request-id|traceparent|tracestate|traceresponse|baggage|x-amzn-trace-id|x-cloud-trace-context|x-b3-.*|b3|uber-trace-id|x-datadog-.*|sentry-trace|cf-ray|x-ratelimit-.*|x-rate-limit-.*|ratelimit.*|retry-after)$/;

// Request headers that differ between attempts of one operation: in the identity, every retry would
// be another request (422). Credentials rotate; ids, trace context and timing marks are per attempt;
// a webhook sender signs a fresh timestamp on every attempt (Standard Webhooks, Svix, Stripe, and
// @idem/webhooks' own sender), as HTTP message signatures (RFC 9421) and AWS SigV4 date theirs; a
// proxy counts its retries (Envoy); framing is per message.
const perAttempt =
  /^(authorization|proxy-authorization|cookie|dpop|idempotency-key|date|content-length|transfer-encoding|connection|keep-alive|te|expect|upgrade|x-request-id|request-id|x-correlation-id|traceparent|tracestate|baggage|x-amzn-trace-id|x-b3-.*|b3|x-cloud-trace-context|sentry-trace|uber-trace-id|x-datadog-.*|x-ot-span-context|grpc-trace-bin|cf-ray|x-request-start|x-queue-start|webhook-timestamp|webhook-signature|svix-timestamp|svix-signature|stripe-signature|signature|signature-input|x-amz-date|x-amz-security-token|x-envoy-attempt-count|x-envoy-expected-rq-timeout-ms|x-forwarded-.*|forwarded|x-real-ip|cf-connecting-ip|true-client-ip)$/;

// Header names as RFC 9110 has them (a token), checked once so that a typo cannot silently match nothing.
const headerName = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;
// A method is a token (RFC 9110 §9.1), of any case here: it is compared upper-cased.
const methodToken = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/** The names of `fingerprint.headers`, lower case, checked: see {@link HttpFingerprintSettings.headers}. */
function checkIdentityHeaders(names: unknown, option = 'fingerprint.headers'): readonly string[] | undefined {
  if (names === undefined) return undefined;
  if (!Array.isArray(names)) throw new TypeError(`${option} must be an array of header names`);
  const lower = new Set<string>();
  for (const name of names) {
    const header = typeof name === 'string' ? name.toLowerCase() : '';
    if (!headerName.test(header)) throw new TypeError(`${option} holds ${JSON.stringify(name)}, no header name`);
    if (perAttempt.test(header)) {
      throw new TypeError(
        `${option} must not include ${header}: it changes from one attempt to the next, so every retry would be refused 422`,
      );
    }
    lower.add(header);
  }
  return lower.size === 0 ? undefined : [...lower];
}

/**
 * The request's fingerprint under each of `fingerprint.previous`: what the engine compares a
 * record's with when the current one does not match it.
 */
function previousFingerprints(
  parts: RequestParts,
  previous: readonly PreviousSettings[],
  headers: IncomingHttpHeaders | undefined,
): string[] {
  return previous.map((settings) =>
    fingerprintRequest(
      { ...parts, headers: settings.headers === undefined ? undefined : identityOf(settings.headers, headers) },
      settings,
    ),
  );
}

/** One of `fingerprint.previous`, checked: its exclude as given, its header names as `identityOf` reads them. */
interface PreviousSettings {
  exclude: readonly string[] | undefined;
  headers: readonly string[] | undefined;
}

/** `fingerprint.previous`, checked as the current settings are; undefined when it lists none. */
function checkPrevious(previous: unknown): readonly PreviousSettings[] | undefined {
  if (previous === undefined) return undefined;
  if (!Array.isArray(previous)) {
    throw new TypeError(
      'fingerprint.previous must be an array of earlier fingerprint settings, each { exclude?, headers? }',
    );
  }
  const checked = previous.map((settings: unknown, i): PreviousSettings => {
    const name = `fingerprint.previous[${i}]`;
    if (settings === null || typeof settings !== 'object' || Array.isArray(settings)) {
      throw new TypeError(`${name} must be { exclude?, headers? }`);
    }
    // Its own check: a nested `previous` is no setting, and a misspelt `exlude` would exclude nothing.
    assertKnownOptions(settings, knownFingerprintSettings, name);
    const { exclude, headers } = settings as HttpFingerprintSettings;
    return {
      exclude: checkExcludes(exclude, `${name}.exclude`),
      headers: checkIdentityHeaders(headers, `${name}.headers`),
    };
  });
  return checked.length === 0 ? undefined : checked;
}

// The values of the identity headers, by name: a repeated field as Node joins it (`, `).
function identityOf(
  names: readonly string[],
  headers: IncomingHttpHeaders | undefined,
): Record<string, string | undefined> {
  if (headers === undefined) {
    throw new TypeError('fingerprint.headers is set, but the adapter passed no request headers to begin()');
  }
  const values: Record<string, string | undefined> = {};
  for (const name of names) {
    const value = headers[name];
    values[name] = Array.isArray(value) ? value.join(', ') : value;
  }
  return values;
}

const MIB = 1_048_576;

/** The header of `advertiseExpiry`. */
const expiresHeader = 'idempotency-expires';

/** Options of {@link principalScope}. */
export interface PrincipalScopeOptions {
  /**
   * Scope by the OAuth client acting for the user too (the principal's `clientId`): two clients of
   * one user then never share a key, and a principal without a client id has no scope. Default
   * false: the user alone, so every client of one user shares the user's keys.
   */
  perClient?: boolean | undefined;
}

/**
 * The default scope: the principal a guard attached to the request (`sub` and `iss` of a verified
 * token, and its `clientId` with `perClient`), or undefined when there is none. Never a client-sent
 * header. Adapters use it without options when no `scope` is given.
 *
 * @example
 * principalScope({ sub: 'user_1', iss: 'https://id.example' }); // '["https://id.example","user_1"]'
 * principalScope({ sub: 'user_1', iss: 'https://id.example', clientId: 'app' }, { perClient: true }); // '["https://id.example","user_1","app"]'
 * principalScope(undefined); // undefined
 */
export function principalScope(auth: unknown, options: PrincipalScopeOptions = {}): string | undefined {
  if (auth === null || typeof auth !== 'object') return undefined;
  const { sub, iss, clientId } = auth as { sub?: unknown; iss?: unknown; clientId?: unknown };
  if (typeof sub !== 'string' || sub.length === 0) return undefined;
  // JSON framing keeps the parts apart whatever characters they contain.
  const issuer = typeof iss === 'string' ? iss : '';
  if (options.perClient !== true) return JSON.stringify([issuer, sub]);
  if (typeof clientId !== 'string' || clientId.length === 0) return undefined;
  return JSON.stringify([issuer, sub, clientId]);
}

/**
 * Creates the framework-free part of an idempotency adapter: option checks, key parsing, scoping,
 * fingerprinting, problem and replay responses, response capture and settlement. The Express,
 * Fastify and Koa packages only translate their request and response objects to this.
 *
 * Bad options throw a `TypeError` here, once.
 *
 * @example
 * const http = createHttpIdempotency({ store: memoryStore() });
 * const started = await http.begin({ method: 'POST', route: '/charges', path: '/charges', query: '',
 *   contentType: 'application/json', keyHeader: '"k-1"', body: Buffer.from('{}'), scope: 'user_1' });
 */
/**
 * The answer to an {@link IdempotencyError}: its status, `Retry-After` when it has one, and its RFC
 * 9457 problem as `application/problem+json`, never cached. Every adapter answers idem's errors with
 * these bytes.
 *
 * @example
 * writeResponse(res, problemResponse(new IdempotencyError('in_progress', 'Still running.', { retryAfter: 1 })));
 */
export function problemResponse(error: IdempotencyError): HttpResponse {
  const headers: Record<string, string> = { 'content-type': 'application/problem+json' };
  if (error.retryAfter !== undefined) headers['retry-after'] = String(error.retryAfter);
  // Problem answers are about this attempt only; nothing in between may cache them.
  headers['cache-control'] = 'no-store';
  return { status: error.status, headers, body: Buffer.from(JSON.stringify(error.toProblem())) };
}

/**
 * True for the reason a lease's `signal` aborts with once the execution lost the key (`lease_lost`):
 * what a handler that stops on the signal throws. Given `context` (the request's
 * `IdempotencyContext`), true only for that execution's own reason: the adapters answer it as a
 * problem (503 with `Retry-After`), and only it. Another request's reason, rethrown by this handler
 * (a shared in-flight call), is this handler's failure, not a lost lease of its own: answered as a
 * problem it would be stored as the outcome, and its retries replayed "retry later" for ever.
 *
 * @example
 * try { req.idempotency?.signal.throwIfAborted(); } catch (error) { if (isLeaseLost(error)) return; }
 */
export function isLeaseLost(error: unknown, context?: Pick<IdempotencyContext, 'signal'>): error is IdempotencyError {
  if (!isIdempotencyError(error) || error.code !== 'lease_lost') return false;
  return context === undefined || context.signal.reason === error;
}

export function createHttpIdempotency<Req>(options: HttpIdempotencyOptions<Req>): HttpIdempotency<Req> {
  if (!options || typeof options !== 'object') throw new TypeError('idempotency needs an options object with a store');
  assertKnownOptions(options, knownHttpOptions, 'idempotency');
  const engine = engineFrom(options);
  const required = options.required ?? true;
  if (typeof required !== 'boolean') throw new TypeError('required must be a boolean');
  const mintKeys = options.mintKeys ?? false;
  if (typeof mintKeys !== 'boolean') throw new TypeError('mintKeys must be a boolean');
  const methodList: unknown = options.methods ?? ['POST', 'PATCH'];
  // An empty list would cover nothing, and every route would run without idempotency, unannounced.
  if (!Array.isArray(methodList) || methodList.length === 0) {
    throw new TypeError('methods must be a non-empty array of method names, such as ["POST", "PATCH"]');
  }
  const methods = new Set<string>();
  for (const method of methodList) {
    if (typeof method !== 'string' || !methodToken.test(method)) {
      throw new TypeError(`methods holds ${JSON.stringify(method)}, no method name`);
    }
    methods.add(method.toUpperCase());
  }
  for (const method of methods) {
    if (method === 'GET' || method === 'HEAD' || method === 'OPTIONS') {
      throw new TypeError(`methods must not include ${method}: safe methods never change state (spec part 1)`);
    }
  }
  const maxBodyBytes = positiveInteger(options.maxBodyBytes ?? MIB, 'maxBodyBytes');
  const maxResponseBytes = positiveInteger(options.maxResponseBytes ?? MIB, 'maxResponseBytes');
  if (options.scope !== undefined && typeof options.scope !== 'function') {
    throw new TypeError('scope must be a function of the request returning the caller');
  }
  const allow = new Set<string>(defaultReplayHeaders);
  const extraReplayed: unknown = options.replayHeaders ?? [];
  // A string would be walked letter by letter, and the header never replayed.
  if (!Array.isArray(extraReplayed)) throw new TypeError('replayHeaders must be an array of header names');
  for (const name of extraReplayed) {
    const lower = typeof name === 'string' ? name.toLowerCase() : '';
    if (!headerName.test(lower)) throw new TypeError(`replayHeaders holds ${JSON.stringify(name)}, no header name`);
    if (neverReplayed.test(lower))
      throw new TypeError(`replayHeaders must not include ${lower}: it belongs to one request only`);
    allow.add(lower);
  }
  const strictKeys = options.strictKeys ?? false;
  if (typeof strictKeys !== 'boolean') throw new TypeError('strictKeys must be a boolean');
  // Checked here, once: a pointer or a header name that means nothing would only show as 422s.
  if (options.fingerprint !== undefined) {
    if (options.fingerprint === null || typeof options.fingerprint !== 'object') {
      throw new TypeError('fingerprint must be { exclude?, headers?, previous? }');
    }
    assertKnownOptions(options.fingerprint, knownFingerprintOptions, 'fingerprint');
  }
  checkExcludes(options.fingerprint?.exclude);
  const identityHeaders = checkIdentityHeaders(options.fingerprint?.headers);
  const previous = checkPrevious(options.fingerprint?.previous);
  const previousReadsHeaders = previous?.some((settings) => settings.headers !== undefined) ?? false;
  const advertiseExpiry = options.advertiseExpiry ?? false;
  if (typeof advertiseExpiry !== 'boolean') throw new TypeError('advertiseExpiry must be a boolean');
  // The announced expiry is stored with the response, so replays carry it too.
  if (advertiseExpiry) allow.add(expiresHeader);
  const replayed: ReplayedHeaders = { names: [...allow], allow };
  const now = options.now ?? Date.now;
  const transactional = options.transactional ?? false;
  if (transactional && !engine.transactional) {
    throw new TypeError('transactional: true needs a store that supports transactions (such as postgresStore)');
  }
  const onEvent = options.onEvent;
  // An observer must never break a request, whether it throws or rejects.
  const emit = (event: IdempotencyEvent) => notify(onEvent, event);

  const covers = (method: string) => methods.has(method.toUpperCase());
  const handles = (method: string, keyHeader: string | readonly string[] | undefined, overrides?: RouteOverrides) =>
    covers(method) &&
    (keyHeader !== undefined || (overrides?.required ?? required) || (overrides?.mintKeys ?? mintKeys));

  const refusesKey = (keyHeader: string | readonly string[] | undefined, overrides?: RouteOverrides) => {
    if (keyHeader === undefined) return (overrides?.required ?? required) && !(overrides?.mintKeys ?? mintKeys);
    return !parseIdempotencyKey(keyHeader, { strict: strictKeys }).ok;
  };

  const problem = problemResponse;

  // A stored compressed body is decoded for a retry that does not take its coding, up to this many
  // bytes; a larger one is served as stored rather than blocking the event loop on a huge inflate.
  const maxDecodedBytes = maxResponseBytes * 16;

  const replay = (stored: StoredResponse, echo: string, acceptEncoding?: string): HttpResponse => {
    let headers: Record<string, string> = {};
    const names = Object.keys(stored.headers);
    for (let i = 0; i < names.length; i++) {
      const name = names[i] as string;
      if (allow.has(name)) headers[name] = stored.headers[name] as string;
    }
    let body = stored.body;
    if (headers['content-encoding'] !== undefined) {
      const negotiated = negotiatedBody(headers, body, acceptEncoding, maxDecodedBytes);
      if (negotiated !== undefined) ({ headers, body } = negotiated);
    }
    headers['idempotency-key'] = echo;
    headers['idempotent-replayed'] = 'true';
    // A replay is one caller's result: shared caches must not keep it (anchors case 40).
    headers['cache-control'] = 'no-store';
    const statusMessage = stored.statusMessage;
    return statusMessage === undefined
      ? { status: stored.status, headers, body }
      : { status: stored.status, headers, body, statusMessage };
  };

  const refuse = (error: IdempotencyError, request: { method: string; route: string }): HttpResponse => {
    if (refusalCodes.has(error.code)) {
      emit({
        type: 'refused',
        code: error.code as RefusalCode,
        status: error.status,
        operation: `${request.method.toUpperCase()} ${request.route}`,
        at: now(),
      });
    }
    return problem(error);
  };

  let warnedStacked = false;
  const begin = async (request: HttpRequestInfo, overrides?: RouteOverrides): Promise<HttpBeginResult> => {
    if (!covers(request.method)) return { kind: 'pass' };
    if (request.stacked === true) {
      if (!warnedStacked) {
        warnedStacked = true;
        process.emitWarning(stackedWarning, { code: 'IDEM_STACKED' });
      }
      return { kind: 'pass' };
    }
    let key: string;
    let echo: string;
    let minted = false;
    if (request.keyHeader === undefined && (overrides?.mintKeys ?? mintKeys)) {
      key = mintKey();
      echo = strictKeys ? `"${key}"` : key;
      minted = true;
    } else {
      if (request.keyHeader === undefined && !(overrides?.required ?? required)) return { kind: 'pass' };
      const parsed = parseIdempotencyKey(request.keyHeader, { strict: strictKeys });
      if (!parsed.ok) return { kind: 'respond', response: refuse(parsed.error, request) };
      key = parsed.key;
      // Echo the field exactly as sent (parsing proved it is one printable ASCII value), so a
      // client comparing it with what it sent finds the same string, quoted or not.
      const field = request.keyHeader;
      echo = (typeof field === 'string' ? field : (field?.[0] ?? key)).trim();
    }
    let body: Uint8Array | undefined;
    let json: unknown;
    if (typeof request.body === 'function') {
      const read = await request.body();
      if (!read.ok) return { kind: 'respond', response: refuse(read.error, request) };
      body = read.body;
      json = read.json;
    } else {
      body = request.body;
      if (body === undefined) json = request.json;
    }
    if (body !== undefined && body.length > maxBodyBytes) {
      return { kind: 'respond', response: refuse(tooLarge(maxBodyBytes), request) };
    }
    // Checked after the body, as Fastify must (it refuses an oversized body while parsing, before the
    // hook that reads the caller runs): the three adapters answer alike, 413 before scope_missing.
    // An empty scope is no caller either: a tenant lookup that falls back to '' for a missing claim
    // would otherwise put every such request in one namespace, the leak scope_missing stops.
    // Anything but a string is a scope function's mistake (a numeric tenant id, an object whose
    // text would be `[object Object]` for every caller, so one namespace): refused as no caller, with
    // a problem body, rather than a TypeError thrown out of the middleware as the framework's 500 page.
    const scope: unknown = request.scope;
    if (typeof scope !== 'string' || scope === '') {
      const detail =
        scope === undefined || scope === ''
          ? 'No authenticated caller to scope the Idempotency-Key to; run the guard first or pass a scope option.'
          : `The scope option returned ${scope === null ? 'null' : `${typeof scope === 'object' ? 'an' : 'a'} ${typeof scope}`}, not the caller as a string.`;
      return { kind: 'respond', response: refuse(new IdempotencyError('scope_missing', detail), request) };
    }
    const parts: RequestParts = {
      method: request.method,
      route: request.route,
      path: request.path,
      query: request.query,
      // Always the same shape (undefined where absent, which the fingerprint treats as absent):
      // spreading optional fields made objects of four shapes and slowed every read of them.
      contentType: request.contentType,
      body,
      json,
      headers: identityHeaders === undefined ? undefined : identityOf(identityHeaders, request.headers),
    };
    const fingerprint = fingerprintRequest(parts, options.fingerprint);
    // Checked on every request, not only when the previous settings are asked (a mismatch): an
    // adapter that passes no headers is found at its first request.
    if (previousReadsHeaders && request.headers === undefined) {
      throw new TypeError('fingerprint.previous names headers, but the adapter passed no request headers to begin()');
    }
    const started = await engine.begin({
      key,
      scope,
      operation: `${request.method.toUpperCase()} ${request.route}`,
      fingerprint,
      alternateFingerprints:
        previous === undefined ? undefined : () => previousFingerprints(parts, previous, request.headers),
    });
    if (started.kind === 'reject') return { kind: 'respond', response: problem(started.error) };
    if (started.kind === 'replay')
      return { kind: 'respond', response: replay(started.response, echo, request.acceptEncoding) };
    return { kind: 'execute', key, echo, lease: started.lease, minted, body };
  };

  // Settles an outcome: undefined when the store answered at once (the capture then ends the response
  // in the same tick), else a promise that never rejects.
  const atOnce = (engine as IdempotencyEngine & { [settleNow]: SettleNow })[settleNow];
  const storeCap = typeof options.store.maxResponseBytes === 'number' ? options.store.maxResponseBytes : undefined;
  // The `Idempotency-Expires` of an outcome of `status`, or undefined when the policy releases it.
  const expiryOf = (operation: string, status: number, thrown: boolean): string | undefined => {
    const retention = atOnce.retentionFor(status, operation, thrown);
    if (retention === undefined) return undefined;
    return new Date(Math.floor((now() + retention) / 1000) * 1000).toUTCString();
  };
  // What a capture of `lease` announces (`advertiseExpiry`): nothing once the handler said it had no
  // effect, since the key is then released. `thrown` is asked when the head goes out: an error
  // answer written after the adapter saw the handler throw (idempotencyErrors(), Fastify's onError,
  // Koa's catch) is judged as the completion will judge it.
  const expiryFor =
    (lease: Lease, thrown: () => boolean) =>
    (status: number): string | undefined =>
      hadNoEffect(lease) ? undefined : expiryOf(lease.operation, status, thrown());
  let warnedLateRelease = false;
  let warnedUnwritablePhrase = false;
  // A handler's mistake that idem repairs (the phrase is dropped), said once per instance so it is
  // fixed where it is made.
  const warnUnwritablePhrase = () => {
    if (warnedUnwritablePhrase) return;
    warnedUnwritablePhrase = true;
    process.emitWarning(unwritablePhraseWarning, { code: 'IDEM_UNWRITABLE_REASON_PHRASE' });
  };
  const sayNoEffect = (lease: Lease) => {
    if (!hasEnded(lease)) {
      mark(lease, noEffectMark);
      return;
    }
    // Too late: the answer is settled (stored, most often). Silent, this mistake would only show
    // as a retry that replays what the handler said must not be kept.
    if (!warnedLateRelease) {
      warnedLateRelease = true;
      process.emitWarning(lateReleaseWarning, { code: 'IDEM_LATE_RELEASE' });
    }
  };
  const overStoreCap = (response: StoredResponse) =>
    storeCap !== undefined && sizeOverLimit(response, storeCap) !== undefined;
  // Releases the key of an execution whose handler said it had no effect, then says so as a policy
  // that releases does: `release`, then `not-stored` with the status the client was sent.
  const releaseWithoutEffect = (lease: Lease, status: number): Awaitable<unknown> => {
    const said = () => emit({ type: 'not-stored', id: lease.id, operation: lease.operation, status, at: now() });
    const released = atOnce.release(lease);
    if (isPending(released)) return released.then(said);
    said();
    return released;
  };
  // `rolledBack`: the outcome's writes were rolled back with its transaction, so nothing ran and a
  // response that cannot be replayed releases the key whatever the policy.
  const settleAtOnce = (
    lease: Lease,
    result: CaptureResult,
    threw: boolean,
    rolledBack = false,
  ): Promise<void> | undefined => {
    mark(lease, endedMark);
    // An error thrown through the chain with an answer said to be for the handler
    // (`answeringForHandler`) is the timeout's: a Koa timeout below idempotency() throws its own.
    // Whatever the response's outcome, the handler did not fail: a policy that releases a thrown
    // handler would let the retry run it a second time.
    const thrown = threw && !answeredForHandler(lease);
    let answer: Awaitable<unknown>;
    try {
      if (result.kind === 'complete' && !hadNoEffect(lease)) {
        const stored = result.response;
        const response: StoredResponse = {
          status: stored.status,
          headers: pick(stored.headers, allow),
          body: stored.body,
        };
        if (stored.statusMessage !== undefined) response.statusMessage = stored.statusMessage;
        // Over the store's own cap: refused by the store, it would only release the key. Settled as
        // a response over maxResponseBytes is, whichever cap is the smaller.
        if (overStoreCap(response)) {
          const expires = response.headers[expiresHeader];
          const tooLarge: CaptureResult = { kind: 'unstorable', reason: 'too-large', status: stored.status, expires };
          return settleAtOnce(lease, tooLarge, thrown, rolledBack);
        }
        answer = atOnce.complete(lease, response, { thrown });
      } else if (result.kind === 'complete') {
        // The handler said its execution had no effect (`release()`): the policy is not asked.
        answer = releaseWithoutEffect(lease, result.response.status);
      } else {
        emit({
          type: 'response-not-stored',
          id: lease.id,
          operation: lease.operation,
          reason: result.reason,
          status: result.status,
          at: now(),
        });
        const reason = result.reason;
        const lost = reason === 'too-large' || reason === 'streaming' ? reason : undefined;
        const response = lost !== undefined && !rolledBack ? unreplayableResponse(lost, result.expires) : undefined;
        if (hadNoEffect(lease)) answer = releaseWithoutEffect(lease, result.status);
        else if (reason === 'answered-early') {
          // Someone else answered while the handler ran (a timeout's 503): that answer is no outcome,
          // and the handler's own can no longer be written. The operation ran, so the key is kept
          // whatever the policy says of the status sent, or a retry would run it a second time. Only
          // a handler that then threw (settled after its end, where the adapter can tell) is
          // released, when the policy releases a thrown handler (not when the answer was said to be
          // for it: see `thrown` above); and one whose transaction was rolled back (held mode): its
          // writes are undone and its handle refuses any more, so the retry runs it as the first
          // attempt would have.
          answer =
            rolledBack || (thrown && atOnce.retentionFor(500, lease.operation, true) === undefined)
              ? atOnce.release(lease)
              : atOnce.complete(lease, unreplayableResponse(reason, undefined), { status: 500 }, true);
        } else if (response !== undefined && !overStoreCap(response)) {
          // The operation ran and its answer went out (in full or in part), but no replay can give
          // it again. The policy decides as for any response of the status the client was sent:
          // stored, the key is kept with an answer that says so, and a retry never runs it again.
          answer = atOnce.complete(lease, response, { thrown, status: result.status, unreplayable: lost });
        } else answer = atOnce.release(lease);
      }
    } catch {
      // complete and release report store failures as values and events; this only guards against
      // a misbehaving custom store, so the request path never sees an exception.
      return undefined;
    }
    return isPending(answer) ? answer.then(ignore, ignore) : undefined;
  };

  const settle = async (lease: Lease, result: CaptureResult, thrown: boolean): Promise<void> => {
    await settleAtOnce(lease, result, thrown);
  };
  const settleRolledBack = async (lease: Lease, result: CaptureResult, thrown: boolean): Promise<void> => {
    await settleAtOnce(lease, result, thrown, true);
  };

  const runTransaction = async (
    lease: Lease,
    capture: ResponseCapture,
    start: (tx: unknown) => void,
    thrown: () => boolean,
    notStarted?: () => void,
  ): Promise<void> => {
    let began = false;
    // Held, the capture settles nothing itself: its end is what seals release() (see `endedMark`).
    // Its lease is known from here on, so is the expiry it announces (`advertiseExpiry`).
    watchedBy(lease, capture);
    const state = (capture as Partial<CaptureHandle>)[captureStateKey];
    if (state !== undefined) {
      state.onEnd = () => mark(lease, endedMark);
      if (advertiseExpiry) state.expires = expiryFor(lease, thrown);
    }
    await transactionOf(
      lease,
      capture,
      (tx) => {
        began = true;
        start(tx);
      },
      thrown,
    );
    if (!began) notStarted?.();
  };

  // Every 503 of transactional mode says what the engine's say: the same `unavailableRetryAfter`.
  const { unavailableRetryAfter } = engine.settings;
  const uncommitted = (cause: unknown) =>
    new IdempotencyError('store_unavailable', 'The transaction could not be committed; retry with the same key.', {
      retryAfter: unavailableRetryAfter,
      cause,
    });

  const transactionAborted = () =>
    new IdempotencyError(
      'transaction_aborted',
      'The server could not commit this request: its handler left the database transaction aborted, or the database refused its writes at commit (a deferred constraint). Nothing was committed, and the key is free again, but the same request is likely to fail the same way.',
    );

  const transactionOf = async (
    lease: Lease,
    capture: ResponseCapture,
    start: (tx: unknown) => void,
    thrown: () => boolean,
  ): Promise<void> => {
    let failed: CaptureResult | undefined;
    // The status of the response handed to the store, for the event of one it could not commit.
    let handed = 0;
    try {
      const result = await engine.transaction(lease, async (tx) => {
        start(tx);
        const outcome = await capture.result;
        // The handler failed because the store did (its `tx.query` lost the connection: a failover,
        // an idle-in-transaction timeout): nothing can commit, as when COMMIT itself fails, and the
        // answer is the same 503, the key freed for the retry. The framework's 500 is no outcome.
        const held = (capture as Partial<CaptureHandle>)[captureStateKey];
        const storeFailure = held?.storeFailure;
        if (storeFailure !== undefined) throw new StoreFailed(storeFailure.error);
        // An answer written for a handler that still runs (a timeout's, see `answeredForHandler`):
        // committed, the handler's writes so far would be kept without the rest (a debit without its
        // credit) under an outcome it never gave. Rolled back, nothing of it ran: see settleAtOnce.
        if (held?.forHandler === true) {
          const status = outcome.kind === 'complete' ? outcome.response.status : outcome.status;
          failed = { kind: 'unstorable', reason: 'answered-early', status };
          throw new RolledBack();
        }
        // A server error or a response that cannot be stored rolls the handler's writes back, so
        // the database never keeps the effects of an outcome that is not recorded with them. So
        // does a handler that said it had no effect: its key is released, and a retry runs again.
        if (outcome.kind !== 'complete' || hadNoEffect(lease)) {
          failed = outcome;
          throw new RolledBack();
        }
        const response = { ...outcome.response, headers: pick(outcome.response.headers, allow) };
        // Over the store's own cap, as over maxResponseBytes: it cannot be stored with the writes.
        // Asked before the status: a 5xx over the cap is no more storable than a 201, and served as
        // written (below) it would be settled as too large after the rollback, its key released
        // under the date its head announced.
        if (overStoreCap(response)) {
          failed = { kind: 'unstorable', reason: 'too-large', status: response.status };
          throw new RolledBack();
        }
        if (response.status >= 500) {
          failed = outcome;
          throw new RolledBack();
        }
        handed = response.status;
        return { value: undefined, response, outcome: { thrown: thrown() } };
      });
      if (result.committed) {
        capture.flush();
        return;
      }
      capture.replace(problem(uncommitted(result.error)));
    } catch (error) {
      // The handler left its transaction aborted (one of its statements failed and it went on), so
      // nothing of it could commit: its failure, not the store's. Its answer is not served as if it
      // had committed; the key is released so that the retry runs once the handler is fixed, and the
      // client is told what happened (500, not a 503 that would have it retry for ever).
      if (isTransactionAbortedError(error)) {
        emit({
          type: 'response-not-stored',
          id: lease.id,
          operation: lease.operation,
          reason: 'transaction-aborted',
          status: handed,
          at: now(),
        });
        await engine.release(lease).catch(() => undefined);
        capture.replace(problem(transactionAborted()));
        return;
      }
      if (error instanceof StoreFailed) {
        emit({
          type: 'store-error',
          id: lease.id,
          operation: lease.operation,
          phase: 'transaction',
          error: error.cause,
          at: now(),
        });
        await engine.release(lease).catch(() => undefined);
        capture.replace(problem(uncommitted(error.cause)));
        return;
      }
      if (!(error instanceof RolledBack) || failed === undefined) {
        await engine.release(lease).catch(() => undefined);
        capture.replace(problem(uncommitted(error)));
        return;
      }
      // A 5xx, the answer of a request no route or no handler took (a 404, a body parser's
      // refusal), or any answer of a handler that said it had no effect (nothing of it needs
      // storing): served as it is once the key is settled.
      // Not a body over maxResponseBytes: nothing of it past the limit was kept (see `copy`), so it
      // cannot go out whole, and gets the 503 below. Nor a live feed: its events are never held.
      if (
        keptWhole(capture) &&
        (failed.kind === 'complete' ||
          failed.reason === 'no-route' ||
          failed.reason === 'body-refused' ||
          (hadNoEffect(lease) && failed.reason !== 'event-stream'))
      ) {
        await settleRolledBack(lease, failed, thrown());
        // Held, nothing went out yet: a date announced before the handler said it had no effect
        // is taken back, since the key is released.
        if (hadNoEffect(lease)) withdrawExpiry(capture);
        capture.flush();
        return;
      }
      await settleRolledBack(lease, failed, thrown());
      capture.replace(
        problem(
          new IdempotencyError(
            'store_unavailable',
            'The response could not be stored with the transaction; retry with the same key.',
            { retryAfter: unavailableRetryAfter },
          ),
        ),
      );
    }
  };

  return {
    engine,
    required,
    mintKeys,
    maxBodyBytes,
    transactional,
    scope: options.scope,
    covers,
    keyHeader: keyFieldValues,
    handles,
    refusesKey,
    begin,
    context: (started) => new ExecutionContext(started.key, started.minted, started.lease, sayNoEffect),
    problem,
    refuse,
    refuseIncompleteBody: (request) => refuse(incompleteBody(), request),
    replay,
    capture: (res, captureOptions) => {
      const target = captureOptions?.settle;
      const onResult = target ? settleCaptured.bind(undefined, settleAtOnce, target) : undefined;
      // Held, the lease is given to runTransaction, which sets the expiry then.
      const expires = advertiseExpiry && target !== undefined ? expiryFor(target.lease, target.thrown) : undefined;
      const capture = captureResponse(
        res,
        captureOptions ?? noCaptureOptions,
        maxResponseBytes,
        onResult,
        replayed,
        expires,
        warnUnwritablePhrase,
      );
      if (target !== undefined) watchedBy(target.lease, capture);
      return capture;
    },
    settle,
    runTransaction,
    emit,
  };
}

class RolledBack extends Error {}

// What a transaction is rolled back with when the handler failed with the store's unavailability.
class StoreFailed extends Error {
  constructor(cause: unknown) {
    super('the store failed inside the transaction', { cause });
  }
}

const unreplayableDetails = {
  'too-large':
    'The operation ran under this key, but its response was larger than the server stores, so it cannot be replayed. It will not run again under this key: look its result up another way, or send a new key to run it again.',
  streaming:
    'The operation ran under this key, but its response was cut short (the client left, or its stream failed) and was not recorded. It will not run again under this key: look its result up another way, or send a new key to run it again.',
  'answered-early':
    'The operation ran under this key, but the server answered before it finished (a timeout), so its response was never recorded. It will not run again under this key: look its result up another way, or send a new key to run it again.',
} as const;

// What is stored in place of a response that was served but cannot be replayed (see
// `Outcome.unreplayable`): what its retries get, with the expiry its head announced.
function unreplayableResponse(reason: keyof typeof unreplayableDetails, expires: string | undefined): StoredResponse {
  const error = new IdempotencyError('response_not_replayable', unreplayableDetails[reason]);
  const headers: Record<string, string> = { 'content-type': 'application/problem+json' };
  if (expires !== undefined) headers[expiresHeader] = expires;
  return { status: error.status, headers, body: Buffer.from(JSON.stringify(error.toProblem())) };
}

const noCaptureOptions: CaptureOptions = Object.freeze({});

// What the HTTP layer marks on a lease, as bits of one property under a symbol of this module: its
// response ended (a release() after that changes nothing, held or not), and its handler said it had
// no effect (`IdempotencyContext.release`). Two WeakSets held these before: an entry per request in a
// weak collection is work for every garbage collection while it lives.
const marksKey = Symbol('idem http marks');
const endedMark = 1;
const noEffectMark = 2;
const answeringMark = 4;
// The capture of the lease's response, for `IdempotencyContext.answeringForHandler`.
const captureOfLease = Symbol('idem capture of lease');
type MarkedLease = Lease & { [marksKey]?: number; [captureOfLease]?: ResponseCapture };

function mark(lease: Lease, bit: number): void {
  const marked = lease as MarkedLease;
  marked[marksKey] = (marked[marksKey] ?? 0) | bit;
}

function hasEnded(lease: Lease): boolean {
  return (((lease as MarkedLease)[marksKey] ?? 0) & endedMark) !== 0;
}

function hadNoEffect(lease: Lease): boolean {
  return (((lease as MarkedLease)[marksKey] ?? 0) & noEffectMark) !== 0;
}

function answeredForHandler(lease: Lease): boolean {
  return (((lease as MarkedLease)[marksKey] ?? 0) & answeringMark) !== 0;
}

function watchedBy(lease: Lease, capture: ResponseCapture): void {
  (lease as MarkedLease)[captureOfLease] = capture;
}

// `IdempotencyContext.answeringForHandler`: the capture takes the answer about to be written as one
// for a running handler (as `idempotencyErrors()` does for connect-timeout's), and the settlement
// knows that an error thrown through the chain with it was the timeout's, not the handler's. After
// the response ended, the handler answered first: nothing to change. So too once the handler's head
// went out (a timer firing while it streams): no other answer can be written in its place (Node
// refuses a second head), and the handler's, whole, is its outcome. Marked, it was settled as a
// timeout's and the key kept `500 response_not_replayable` though its client had the whole answer.
// Held, nothing went out yet: a head written into the hold is still taken (see transactionOf).
// The lease is marked all the same: a Koa timeout below idempotency() still throws through the
// chain, and that error is the timeout's, not the handler's (see settleAtOnce).
function answeringForHandler(lease: Lease): void {
  if (hasEnded(lease)) return;
  mark(lease, answeringMark);
  const capture = (lease as MarkedLease)[captureOfLease];
  if (capture !== undefined && !headWentOut(capture)) capture.answeredForHandler();
}

function headWentOut(capture: ResponseCapture): boolean {
  const state = (capture as Partial<CaptureHandle>)[captureStateKey];
  return state !== undefined && !state.hold && state.res.headersSent;
}

// One class for every execution's context: `signal` is a getter on the prototype, and the lease
// makes its AbortController only when a handler asks for it.
class ExecutionContext implements IdempotencyContext {
  tx: unknown = undefined;
  readonly #lease: Lease;
  readonly #sayNoEffect: (lease: Lease) => void;
  #release: (() => void) | undefined = undefined;
  #answering: (() => void) | undefined = undefined;
  #keyFor: ((purpose: string) => string) | undefined = undefined;

  constructor(
    public key: string,
    public minted: boolean,
    lease: Lease,
    sayNoEffect: (lease: Lease) => void,
  ) {
    this.#lease = lease;
    this.#sayNoEffect = sayNoEffect;
  }

  // The methods are bound to their execution on first use, so a handler may take them off the
  // context (`const { release } = req.idempotency`): unbound, `release()` threw, Express answered
  // 500, and the policy stored the very answer the handler said must not be kept. Made on first use,
  // since most handlers call neither.
  get release(): () => void {
    if (this.#release === undefined) this.#release = () => this.#sayNoEffect(this.#lease);
    return this.#release;
  }

  get answeringForHandler(): () => void {
    if (this.#answering === undefined) this.#answering = answeringForHandler.bind(undefined, this.#lease);
    return this.#answering;
  }

  get signal(): AbortSignal {
    return this.#lease.signal;
  }

  get recovered(): boolean {
    return this.#lease.recovered;
  }

  get keyFor(): (purpose: string) => string {
    if (this.#keyFor === undefined) this.#keyFor = (purpose) => downstreamKey(this.#lease, purpose);
    return this.#keyFor;
  }
}

// A capture's settlement: shared and bound per response rather than a closure made per response.
function settleCaptured(
  settle: (lease: Lease, result: CaptureResult, thrown: boolean) => Promise<void> | undefined,
  target: NonNullable<CaptureOptions['settle']>,
  result: CaptureResult,
): Promise<void> | undefined {
  return settle(target.lease, result, target.thrown());
}

function ignore() {
  // Settling never fails the response: store failures are reported as events.
}

const incompleteBody = () =>
  new IdempotencyError(
    'body_incomplete',
    'The request body ended before it was complete; send it again with the same key.',
  );

// The errors `refuse` reports: those that answer a request before its record is looked up.
const refusalCodes: ReadonlySet<string> = new Set<RefusalCode>([
  'key_missing',
  'key_invalid',
  'scope_missing',
  'body_too_large',
  'body_incomplete',
]);

const tooLarge = (limit: number) =>
  new IdempotencyError('body_too_large', `The request body is larger than ${limit} bytes.`);

function positiveInteger(value: number, name: string): number {
  if (!Number.isInteger(value) || value < 1) throw new TypeError(`${name} must be a positive integer`);
  return value;
}

function pick(headers: Record<string, string>, allow: ReadonlySet<string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name in headers) if (allow.has(name)) out[name] = headers[name] as string;
  return out;
}

/** What a body reader passed to {@link HttpIdempotency.begin} resolves to. */
export type BodyRead =
  | {
      ok: true;
      body: Uint8Array | undefined;
      /** The body as a parser that ran first left it, when `body` (the raw bytes) is gone. */
      json?: unknown;
    }
  | { ok: false; error: IdempotencyError };

/** The result of {@link readRequestBody}. */
export type ReadBodyResult = { ok: true; body: Buffer | undefined } | { ok: false; error: IdempotencyError };

/**
 * Reads a Node request body into memory, up to `maxBytes`, and puts the bytes back into the stream
 * with `unshift`, so a body parser that runs afterwards (express.json, @koa/bodyparser, multer) reads
 * the very same bytes as if nothing had happened. Over the limit: 413 at once, nothing hashed.
 * When the stream was already consumed by an earlier parser, resolves `{ ok: true, body: undefined }`.
 *
 * @example
 * const read = await readRequestBody(req, 1_048_576);
 * if (!read.ok) return send(problem(read.error));
 */
export function readRequestBody(req: IncomingMessage, maxBytes: number): Promise<ReadBodyResult> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > maxBytes)
    return Promise.resolve({ ok: false, error: tooLarge(maxBytes) });
  if (req.readableEnded || (req.complete && req.readableLength === 0)) {
    return Promise.resolve({ ok: true, body: undefined });
  }
  if (!carriesBody(req)) return Promise.resolve({ ok: true, body: undefined });
  // A chunked body may be empty (`0\r\n\r\n` alone), and its last chunk may sit in the packet whose
  // head is being parsed while this runs. A listener added now would read the ended, empty request
  // on the next tick, and its 'end' would go out before the body parser listens: nothing can be put
  // back to take it back (see readAvailable), and the parser finds the request closed (body-parser
  // leaves no body, @koa/bodyparser answers 499). Looked at once the packet is parsed, it is whole
  // and untouched, and left to the parser.
  if (!Number.isFinite(declared) && req.httpVersionMajor !== 2) {
    return Promise.resolve().then(() =>
      req.readableEnded || (req.complete && req.readableLength === 0)
        ? { ok: true, body: undefined }
        : startReading(req, maxBytes, 'readable'),
    );
  }
  return startReading(req, maxBytes, 'readable');
}

/**
 * Whether a request carries a body, by its framing. HTTP/1.1 frames one by Content-Length or
 * Transfer-Encoding, and neither means none (RFC 9112 6.3). HTTP/2 frames it by DATA frames and
 * END_STREAM: Content-Length is optional there and Transfer-Encoding never sent (RFC 9113 8.1.1,
 * 8.2.2), so a request without either may well carry one (left unread, it would go unfingerprinted
 * and unbounded); it has none only when its stream ended with its headers.
 *
 * @example
 * if (!carriesBody(req)) return { ok: true, body: undefined };
 */
export function carriesBody(req: IncomingMessage | Http2ServerRequest): boolean {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared)) return declared > 0;
  if (req.headers['transfer-encoding'] !== undefined) return true;
  const h2 = (req as { stream?: { endAfterHeaders?: boolean } }).stream;
  return req.httpVersionMajor === 2 && h2 !== undefined && h2.endAfterHeaders !== true;
}

/** What a body parser that ran before the middleware left on the request. */
export interface ParsedBodyFields {
  /** The raw text or bytes some parsers keep (e.g. with a `verify` hook, or koa-bodyparser). */
  rawBody?: unknown;
  /** The parsed body. */
  body?: unknown;
}

/**
 * The body to fingerprint: the raw bytes read with {@link readRequestBody} (and put back for later
 * parsers), or, when a parser that ran first already drained the stream, what it left in `parsed`:
 * its raw bytes if it kept them, else the parsed body, which the fingerprint canonicalises as it is
 * (no round trip through text).
 *
 * @example
 * const read = await readBodyForFingerprint(req, 1_048_576, req);
 */
export async function readBodyForFingerprint(
  req: IncomingMessage,
  maxBytes: number,
  parsed: ParsedBodyFields,
): Promise<BodyRead> {
  const read = await readRequestBody(req, maxBytes);
  if (!read.ok) return read;
  if (read.body !== undefined) {
    return decodeRequestBody(read.body, req.headers['content-encoding'], maxBytes);
  }
  return parsedBodyRead(parsed, req.headers['content-type']);
}

/**
 * The bytes of a request body to fingerprint, decoded by its `Content-Encoding`: a compressed body is
 * fingerprinted by what it says, as the parser after us will read it, so the same JSON compressed
 * twice (gzip writes a timestamp into its header) or once sent plain is one request. Decoded up to
 * `maxBytes` (413 past it: a small bomb must not expand); a body that does not decode is left as it
 * came, and marked so: the parser will refuse it, and that refusal releases the key (see
 * `markUndecodable`). Without an encoding, the body as it is. Exported for an adapter that reads the
 * raw body itself and hands the encoded bytes on to the framework (Fastify: `@fastify/compress`
 * decodes them after the plugin's hook).
 *
 * @example
 * const read = decodeRequestBody(body, request.headers['content-encoding'], 1_048_576);
 */
export function decodeRequestBody(body: Buffer, encoding: string | undefined, maxBytes: number): ReadBodyResult {
  if (encoding === undefined) return { ok: true, body };
  const decode = decoderOf(encoding.trim().toLowerCase());
  if (decode === undefined) return { ok: true, body };
  try {
    const decoded = decode(body, { maxOutputLength: maxBytes });
    // A parser that does not decode refuses the bytes as sent: still this request's refusal.
    markDecoded(decoded, body);
    return { ok: true, body: decoded };
  } catch (error) {
    if ((error as { code?: unknown }).code === 'ERR_BUFFER_TOO_LARGE') return { ok: false, error: tooLarge(maxBytes) };
    // The parser meets the same error and refuses the body: its 400 must release the key.
    markUndecodable(body);
    return { ok: true, body };
  }
}

/**
 * The body to fingerprint from what a parser left: its raw bytes if it kept them, else the parsed
 * body. Bytes are bytes. A string is the body's text, except under a JSON `contentType`, where it is
 * the JSON string a parser made of the body (`express.json({ strict: false })`, Fastify's parser):
 * the body `"123"` must not fingerprint as the body `123`, nor `"{\"a\":1}"` as `{"a":1}`. Anything
 * else is canonicalised as it is, with no round trip through text, which gives the fingerprint its
 * raw JSON bytes would give.
 *
 * @example
 * const read = parsedBodyRead({ body: request.body }, request.headers['content-type']);
 */
export function parsedBodyRead(parsed: ParsedBodyFields, contentType?: string): BodyRead & { ok: true } {
  const raw = parsed.rawBody;
  if (raw instanceof Uint8Array) return { ok: true, body: raw };
  if (typeof raw === 'string') return { ok: true, body: Buffer.from(raw) };
  const body = parsed.body;
  if (body === undefined || body instanceof Uint8Array) return { ok: true, body };
  if (typeof body === 'string' && !isJsonContentType(contentType)) return { ok: true, body: Buffer.from(body) };
  return { ok: true, body: undefined, json: body };
}

/** One body being read into memory; its listeners are shared functions bound to it. */
interface BodyReading<S extends Readable> {
  readonly stream: S;
  readonly maxBytes: number;
  readonly chunks: Buffer[];
  size: number;
  readonly resolve: (result: ReadBodyResult) => void;
  onReadable: (() => void) | undefined;
  onData: ((chunk: Buffer | string) => void) | undefined;
  onEnd: (() => void) | undefined;
  onError: (() => void) | undefined;
}

function bodyRead(read: BodyReading<Readable>, result: ReadBodyResult) {
  const stream = read.stream;
  if (read.onReadable) stream.removeListener('readable', read.onReadable);
  if (read.onData) stream.removeListener('data', read.onData);
  stream.removeListener('error', read.onError as () => void);
  stream.removeListener('end', read.onEnd as () => void);
  read.resolve(result);
}

// A stream error (most often the client hanging up mid-upload, or a request timeout) leaves the body
// unknown. Hashed as no body, it would claim the key with the wrong fingerprint and store the
// parser's error, so the client's real retry got a 422: nothing is claimed instead.
function unreadableBody(this: BodyReading<Readable>) {
  bodyRead(this, { ok: false, error: incompleteBody() });
}

// For readRequestBody, 'end' only fires when something else consumed the data; with our own reads
// we stop before it.
function endOfBody(this: BodyReading<Readable>) {
  // An HTTP/2 request whose client reset the stream mid-upload ends its readable side normally, with
  // no 'error' as an HTTP/1.1 one gives: its `aborted` says the body is cut short.
  if ((this.stream as { aborted?: boolean }).aborted === true) {
    bodyRead(this, { ok: false, error: incompleteBody() });
    return;
  }
  bodyRead(this, { ok: true, body: joined(this.chunks) });
}

// The chunks as one buffer. Most bodies arrive in one chunk, which is used as it is: nothing writes
// to a request's chunks, and a copy per request would only be garbage.
function joined(chunks: Buffer[]): Buffer {
  return chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks);
}

function readAvailable(this: BodyReading<IncomingMessage>) {
  const req = this.stream;
  for (;;) {
    // Never a read of nothing: on an ended request it schedules 'end', which no bytes put back can
    // then cancel, and an empty chunked body would reach the parser as a closed request.
    if (req.readableLength === 0) break;
    const chunk: Buffer | null = req.read();
    if (chunk === null) break;
    this.size += chunk.length;
    if (this.size > this.maxBytes) {
      bodyRead(this, { ok: false, error: tooLarge(this.maxBytes) });
      // The rest is discarded as it arrives: left unread, it would stall the kept-alive connection
      // (Node only drains a body nobody started reading).
      req.resume();
      return;
    }
    this.chunks.push(chunk);
  }
  // `complete` is set when the last byte arrived. Read returned null, so everything is in
  // hand; 'end' is only scheduled for the next tick, and unshifting now cancels it, so the next
  // reader sees the whole body and then its end. An Http2ServerRequest only turns `complete` once
  // its 'end' was emitted, too late to put the bytes back: there, its stream has ended (END_STREAM
  // received and handed over) by the time the last 'readable' comes.
  // An HTTP/2 request its client reset is `complete` too, with only the bytes that came.
  if ((req as { aborted?: boolean }).aborted === true) {
    bodyRead(this, { ok: false, error: incompleteBody() });
    return;
  }
  if (req.complete || lastBytesIn(req)) {
    const body = joined(this.chunks);
    if (body.length > 0) req.unshift(body);
    bodyRead(this, { ok: true, body });
  }
}

// Over HTTP/2: the request's stream ended, so every byte of the body was pushed to the request; an
// aborted one is cut short, which 'end' reports (endOfBody).
function lastBytesIn(req: IncomingMessage): boolean {
  const stream = (req as { stream?: Readable }).stream;
  return stream?.readableEnded === true && (req as { aborted?: boolean }).aborted !== true;
}

// `headersDistinct` would build a distinct copy of every header of the request on first use; only
// one field is needed, so the raw name/value list is scanned for it instead, with the same result.
function keyFieldValues(req: IncomingMessage): string | readonly string[] | undefined {
  const raw = req.rawHeaders;
  if (!Array.isArray(raw)) return req.headersDistinct?.['idempotency-key'] ?? req.headers['idempotency-key'];
  let values: string[] | undefined;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i] as string;
    if (name.length === 15 && name.toLowerCase() === 'idempotency-key') {
      if (values === undefined) values = [raw[i + 1] as string];
      else values.push(raw[i + 1] as string);
    }
  }
  return values ?? req.headers['idempotency-key'];
}

/**
 * Reads a whole stream into memory, up to `maxBytes` (for frameworks such as Fastify that hand over the
 * payload stream and accept a replacement). Over the limit resolves `{ ok: false }` with a 413 error.
 * Pass the request's `Content-Length` as `declaredLength`: a declared size over the limit is refused at
 * once, so a client that announces gigabytes and sends a trickle cannot hold the request open.
 *
 * @example
 * const read = await readStream(payload, 1_048_576, request.headers['content-length']);
 */
export function readStream(
  stream: Readable,
  maxBytes: number,
  declaredLength?: string | number,
): Promise<ReadBodyResult> {
  if (declaredLength !== undefined && Number(declaredLength) > maxBytes) {
    return Promise.resolve({ ok: false, error: tooLarge(maxBytes) });
  }
  return startReading(stream, maxBytes, 'data');
}

/**
 * Collects a body with listeners bound to one reading state (no closures per request). An
 * IncomingMessage is read in paused mode (`readable`), so bytes left unread stay in its buffer for a
 * parser; a framework's payload stream flows (`data`).
 */
function startReading(stream: Readable, maxBytes: number, mode: 'readable' | 'data'): Promise<ReadBodyResult> {
  return new Promise((resolve) => {
    const read: BodyReading<Readable> = {
      stream,
      maxBytes,
      chunks: [],
      size: 0,
      resolve,
      onReadable: undefined,
      onData: undefined,
      onEnd: undefined,
      onError: undefined,
    };
    read.onEnd = endOfBody.bind(read);
    read.onError = unreadableBody.bind(read);
    if (mode === 'readable') {
      read.onReadable = readAvailable.bind(read as BodyReading<IncomingMessage>);
      stream.on('readable', read.onReadable);
    } else {
      read.onData = streamData.bind(read);
      stream.on('data', read.onData);
    }
    stream.on('error', read.onError);
    stream.on('end', read.onEnd);
  });
}

function streamData(this: BodyReading<Readable>, chunk: Buffer | string) {
  const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
  this.size += bytes.length;
  if (this.size > this.maxBytes) {
    // Not destroyed: on a request, that would kill the socket before the 413 is written. The
    // rest of the body is drained and dropped instead.
    bodyRead(this, { ok: false, error: tooLarge(this.maxBytes) });
    this.stream.resume();
    return;
  }
  this.chunks.push(bytes);
}

/**
 * Writes an {@link HttpResponse} straight to Node's response, bypassing the framework, so replays and
 * problems are byte-identical whichever framework serves them.
 *
 * @example
 * writeResponse(res, http.problem(error));
 */
export function writeResponse(res: ServerResponse, response: HttpResponse): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  const bodyless = response.status === 204 || response.status === 304;
  const headers: OutgoingHttpHeaders = {};
  // Over HTTP/2, fields about one connection are malformed (RFC 9113 8.2.2): Node throws on them,
  // and a replay stored from an HTTP/1.1 answer may carry one. Left out there.
  const h2 = streamOf(res) !== undefined;
  for (const name in response.headers) {
    if (h2 && connectionSpecific.has(name.toLowerCase())) continue;
    headers[name] = response.headers[name];
  }
  const body = response.body;
  if (!bodyless) headers['content-length'] = String(body.length);
  // HTTP/2 has no reason phrase (Node warns when given one there, or when one is set).
  if (response.statusMessage !== undefined && !h2) res.writeHead(response.status, response.statusMessage, headers);
  else {
    // The status line is this response's own. Node keeps a phrase set on `res` before (a handler's
    // `res.statusMessage`, Koa's `ctx.status`, which sets its status's) over a writeHead without one:
    // idem's 500 in place of a held 201 whose COMMIT was refused went out as `500 Created`.
    if (!h2) res.statusMessage = '';
    res.writeHead(response.status, headers);
  }
  if (bodyless) res.end();
  // Node sends a string body in one write together with the head (a Buffer takes a second chunk and
  // a writev). Latin-1 maps each byte to one character and back, so the bytes on the wire are the
  // very same; large bodies go as they are rather than being copied into a string.
  else {
    const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body.buffer, body.byteOffset, body.length);
    if (bytes.length <= latin1Limit) res.end(bytes.toString('latin1'), 'latin1');
    else res.end(bytes);
  }
}

/**
 * Whether a header field is about one connection, which an HTTP/2 message must not carry (RFC 9113
 * 8.2.2; Node throws on it): for an adapter copying headers onto a response that may be HTTP/2.
 *
 * @example
 * if (!connectionSpecificField('keep-alive')) res.setHeader('keep-alive', 'timeout=5');
 */
export function connectionSpecificField(name: string): boolean {
  return connectionSpecific.has(name.toLowerCase());
}

// The fields HTTP/2 forbids (RFC 9113 8.2.2), as Node refuses them.
const connectionSpecific: ReadonlySet<string> = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'upgrade',
  'http2-settings',
  'te',
]);

// Above this, copying the body into a string costs more than the extra chunk it saves.
const latin1Limit = 16_384;

function toBuffer(chunk: unknown, encoding: unknown): Buffer | undefined {
  if (chunk === undefined || chunk === null || typeof chunk === 'function') return undefined;
  if (typeof chunk === 'string')
    return Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return undefined;
}

/**
 * A framework's header map (Node's `getHeaders()`, Fastify's `reply.getHeaders()`, Koa's
 * `ctx.response.headers`) as a response's headers: names in lower case, a list joined with `, `,
 * unset ones left out. Into `out` when given.
 *
 * @example
 * headerRecord({ 'Content-Type': 'text/plain', Link: ['<a>', '<b>'] }); // { 'content-type': 'text/plain', link: '<a>, <b>' }
 */
export function headerRecord(raw: Record<string, unknown>, out: Record<string, string> = {}): Record<string, string> {
  const names = Object.keys(raw);
  for (let i = 0; i < names.length; i++) {
    const name = names[i] as string;
    const value = raw[name];
    if (value === undefined) continue;
    out[name.toLowerCase()] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return out;
}

const noHeaders: Record<string, string> = Object.freeze({}) as Record<string, string>;

// writeHead(status, [reason], [headers]) where headers is an object or a flat [name, value, ...] array.
function writeHeadHeaders(args: unknown[]): Record<string, string> {
  let last: object | undefined;
  for (let i = 1; i < args.length; i++) {
    const arg = args[i];
    if (arg !== null && typeof arg === 'object') {
      last = arg;
      break;
    }
  }
  if (last === undefined) return noHeaders;
  if (Array.isArray(last)) {
    const out: Record<string, string> = {};
    // A name may repeat (two Link fields): joined as one list, as getHeader() gives a repeated header.
    for (let i = 0; i + 1 < last.length; i += 2) {
      const name = String(last[i]).toLowerCase();
      const value = String(last[i + 1]);
      out[name] = out[name] === undefined ? value : `${out[name]}, ${value}`;
    }
    return out;
  }
  return headerRecord(last as Record<string, unknown>);
}

// The headers of a response: those set on it, then those passed to writeHead (which Node may not
// copy onto the response).
/** The headers a replay may carry, as a list to walk and a set to test. */
interface ReplayedHeaders {
  readonly names: readonly string[];
  readonly allow: ReadonlySet<string>;
}

// Only the headers a replay may carry are kept, so only those are looked up: `getHeaders()` would
// copy every header of the response into a new object first.
function responseHeaders(
  res: ServerResponse,
  head: Record<string, string>,
  replayed: ReplayedHeaders,
): Record<string, string> {
  const out: Record<string, string> = {};
  const names = replayed.names;
  for (let i = 0; i < names.length; i++) {
    const name = names[i] as string;
    const value = res.getHeader(name);
    if (value !== undefined) out[name] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  for (const name in head) if (replayed.allow.has(name)) out[name] = head[name] as string;
  return out;
}

function callbackOf(a: unknown, b: unknown, c: unknown): unknown {
  if (typeof a === 'function') return a;
  if (typeof b === 'function') return b;
  return typeof c === 'function' ? c : undefined;
}

type Apply = (...args: unknown[]) => unknown;

/** Everything one capture knows, in one object: the wrappers below are shared, not made per response. */
interface CaptureState {
  readonly res: ServerResponse;
  readonly hold: boolean;
  readonly maxBytes: number;
  readonly unrouted: (() => boolean) | undefined;
  readonly echo: string | undefined;
  /**
   * `res.errored` when the capture began: only `destroy()` changes it, so a different value at the
   * close says the server destroyed the response (a client that left does not call it).
   */
  readonly erroredAtStart: Error | null | undefined;
  /** The stored response keeps only these headers (the rest never reach a replay). */
  readonly replayed: ReplayedHeaders;
  /** The `Idempotency-Expires` value for a status (`advertiseExpiry`), or undefined to send none. */
  expires: ((status: number) => string | undefined) | undefined;
  /** Settles the outcome; undefined back means it is settled already (an in-process store). */
  readonly onResult: ((result: CaptureResult) => Promise<void> | undefined) | undefined;
  readonly originalWriteHead: Apply;
  readonly originalWrite: Apply;
  readonly originalEnd: Apply;
  /**
   * HTTP/1.1 only: the response's own `flushHeaders`, wrapped so its head leaves in Latin-1 (see
   * inLatin1Head), or, held, so that it keeps the held head (see heldFlushHeaders).
   */
  originalFlushHeaders: Apply | undefined;
  /** HTTP/2 only: the response's own `destroy`, wrapped to see a destroy by the server (below). */
  originalDestroy: Apply | undefined;
  /**
   * What emits the response's 'timeout' to its listeners (the response, or over HTTP/2 its stream,
   * where `res.setTimeout` puts them), and its `emit` before the capture wrapped it (see
   * watchTimeouts), if it did.
   */
  timeoutEmitter: { emit: Apply } | undefined;
  originalEmit: Apply | undefined;
  /** HTTP/2 only: the server destroyed the response (a destroy without an error leaves no trace there). */
  destroyedByServer: boolean;
  /**
   * A 'timeout' listener destroyed the response and wrote nothing: the cut Node itself makes of a
   * timed-out socket nobody listens for, so the close is a client's that left, not a server's that
   * gave up on the response (see capturedEmit).
   */
  cutByTimeout: boolean;
  /**
   * HTTP/2 only: the server destroyed the response with an error. Its stream's `errored` cannot say:
   * a client's RST_STREAM with an error code (not CANCEL) sets it too.
   */
  destroyedWithError: boolean;
  readonly chunks: Buffer[];
  size: number;
  overflow: boolean;
  eventStream: boolean;
  status: number | undefined;
  headArgs: unknown[] | undefined;
  headHeaders: Record<string, string>;
  /**
   * The headers a replay keeps, as they were when the handler's head went down. Read later, they
   * would include what a layer below added on the way, e.g. compression()'s Content-Encoding over
   * the uncompressed bytes this capture copies.
   */
  headers: Record<string, string> | undefined;
  ended: boolean;
  // The outcome once known; the promise of `result` is only made when someone asks for it.
  outcome: CaptureResult | undefined;
  resultPromise: Promise<CaptureResult> | undefined;
  resolveResult: ((result: CaptureResult) => void) | undefined;
  settling: Promise<void> | undefined;
  // Content-Length of the response, once known (null: not looked up yet), the body bytes passed
  // through so far, and the last byte when it is held back until the outcome is stored.
  declared: number | undefined | null;
  passed: number;
  tail: Buffer | undefined;
  /** Why the answer is no outcome at all, when the adapter said so before its end (`failedWith`). */
  declined: Extract<NotStoredReason, 'body-refused'> | undefined;
  /** The store's own unavailability, when that is what the handler failed with (`failedWith`). */
  storeFailure: { error: unknown } | undefined;
  /** The handler returned, and the framework writes the rest (`handlerReturned`). */
  returned: boolean;
  /** What settles an outcome whose client left after the handler returned, and its argument. */
  onClosed: ((context: unknown, capture: ResponseCapture) => void) | undefined;
  onClosedContext: unknown;
  /** The capture this state belongs to, for `onClosed`. */
  handle: ResponseCapture | undefined;
  /** The response closed before its head went out, and is not given up (yet). */
  closedEarly: boolean;
  /** This capture set `Idempotency-Expires` (not the handler). */
  announced: boolean;
  /** Called once the outcome is known, before anyone learns it (held mode: see runTransaction). */
  onEnd: (() => void) | undefined;
  /** What a body parser's refusal is checked against (`failedWith`). */
  readonly request: RequestBodyFacts | undefined;
  /** Whether the handler still runs, where the adapter can tell (see `CaptureOptions.handler`). */
  readonly handler: RunningHandler | undefined;
  /** The next end is an answer for a handler that runs on unseen (`answeredForHandler`). */
  forHandler: boolean;
  /** The status of an answer written while the handler ran, once it ended (see `endAnsweredEarly`). */
  answeredEarly: number | undefined;
  /**
   * Something was handed down to Node's write or end: the head has left with it, or (a 204, a 304, a
   * HEAD: Node drops a body write) waits for the end or a flush (see inLatin1Head, capturedFlushHeaders).
   */
  headLeft: boolean;
  /**
   * Not held, over HTTP/1: the reason phrase Node wrote into the head at writeHead. One set on the
   * response after it never goes out, so it is not the one stored (see capturedReasonPhrase).
   */
  sentPhrase: string | undefined;
  /** Says that a reason phrase Node cannot write was dropped (see dropUnwritablePhrase). */
  readonly unwritablePhrase: () => void;
}

/**
 * Wraps one response's `writeHead`, `write` and `end`. Every way a framework writes (Express
 * `res.json/send/end/write/sendFile`, a piped stream, Fastify's reply, Koa's `ctx.body`) goes through
 * these three, so nothing the client receives escapes the copy.
 */
function captureResponse(
  res: ServerResponse,
  options: CaptureOptions,
  maxBytes: number,
  onResult: ((result: CaptureResult) => Promise<void> | undefined) | undefined,
  replayed: ReplayedHeaders,
  expires: ((status: number) => string | undefined) | undefined,
  unwritablePhrase: () => void,
): ResponseCapture {
  const state: CaptureState = {
    res,
    hold: options.hold ?? false,
    maxBytes,
    unrouted: options.unrouted,
    echo: options.echo,
    erroredAtStart: erroredOf(res),
    onResult,
    replayed,
    expires,
    originalWriteHead: res.writeHead as Apply,
    originalWrite: res.write as Apply,
    originalEnd: res.end as Apply,
    originalFlushHeaders: undefined,
    originalDestroy: undefined,
    timeoutEmitter: undefined,
    originalEmit: undefined,
    destroyedByServer: false,
    cutByTimeout: false,
    destroyedWithError: false,
    chunks: [],
    size: 0,
    overflow: false,
    eventStream: false,
    status: undefined,
    headArgs: undefined,
    headHeaders: noHeaders,
    headers: undefined,
    ended: false,
    outcome: undefined,
    resultPromise: undefined,
    resolveResult: undefined,
    settling: undefined,
    declared: null,
    passed: 0,
    tail: undefined,
    declined: undefined,
    storeFailure: undefined,
    returned: false,
    onClosed: undefined,
    onClosedContext: undefined,
    handle: undefined,
    closedEarly: false,
    announced: false,
    onEnd: undefined,
    request: options.request,
    handler: options.handler,
    forHandler: false,
    answeredEarly: undefined,
    headLeft: false,
    sentPhrase: undefined,
    unwritablePhrase,
  };
  res.writeHead = capturedWriteHead.bind(state) as ServerResponse['writeHead'];
  res.write = capturedWrite.bind(state) as ServerResponse['write'];
  res.end = capturedEnd.bind(state) as ServerResponse['end'];
  // An HTTP/1.1 response's `errored` tells a destroy by the server from a client that left, even one
  // without an error (it turns from null to undefined). An Http2ServerResponse has no `errored`, and
  // its stream's stays null then: its `destroy` is watched instead. Only there, to keep HTTP/1.1's
  // path as it was.
  if (streamOf(res) !== undefined) {
    state.originalDestroy = res.destroy as Apply;
    res.destroy = capturedDestroy.bind(state) as ServerResponse['destroy'];
  } else {
    state.originalFlushHeaders = res.flushHeaders as Apply;
    res.flushHeaders = (state.hold ? heldFlushHeaders : capturedFlushHeaders).bind(
      state,
    ) as ServerResponse['flushHeaders'];
  }
  if (state.handler === undefined) watchTimeouts(state);
  // The client went away while a streamed body was being written: the pipe stops and `end` never
  // comes, so the outcome cannot be known in full (in held mode too: the transaction must end).
  // Before the head is written, see onCapturedClose.
  res.on('close', onCapturedClose.bind(state));
  // A body stream handed to the response: if the server then destroys it, the handler had begun
  // its answer (see failedWhileAnswering). Shared: it marks the response, not this state.
  res.on('pipe', markPiped);
  // Unpiped while still open (the handler chose to answer whole instead), it no longer answers: a
  // client that leaves then leaves a working handler, not a stream cut short.
  res.on('unpipe', markUnpiped);
  const capture: ResponseCapture & { [captureStateKey]: CaptureState } = Object.create(captureMethods);
  capture[captureStateKey] = state;
  state.handle = capture;
  // Closed already: the client left while the key was being claimed (a store round trip), and the
  // 'close' above will never come. Taken as it would have been: a framework that then ends nothing
  // (Express's sendFile, Fastify skipping an aborted reply) would leave the key renewed for good.
  if (destroyedOf(res)) onCapturedClose.call(state);
  return capture;
}

const captureStateKey = Symbol('capture state');

type CaptureHandle = ResponseCapture & { [captureStateKey]: CaptureState };

// The methods of every ResponseCapture, shared through the prototype.
const captureMethods: ResponseCapture = {
  get result() {
    const state = (this as CaptureHandle)[captureStateKey];
    if (state.resultPromise === undefined) {
      const known = state.outcome;
      state.resultPromise =
        known === undefined
          ? new Promise<CaptureResult>((resolve) => {
              state.resolveResult = resolve;
            })
          : Promise.resolve(known);
    }
    return state.resultPromise;
  },
  get ended() {
    return (this as CaptureHandle)[captureStateKey].ended;
  },
  completeWith(response) {
    const state = (this as CaptureHandle)[captureStateKey];
    if (state.ended) return;
    state.ended = true;
    restore(state);
    // A body the parser refused is no outcome, whoever writes its answer (Koa, for a client gone).
    if (state.declined !== undefined) {
      finish(state, { kind: 'unstorable', reason: state.declined, status: response.status });
      return;
    }
    // The same cap as for a written response: what a replay cannot give is not stored.
    if (response.body.byteLength > state.maxBytes) unreplayable(state, 'too-large', response.status);
    else finish(state, { kind: 'complete', response });
  },
  completeAsWritten(response) {
    const state = (this as CaptureHandle)[captureStateKey];
    if (state.ended) return;
    dropUnwritablePhrase(state);
    const { statusMessage: _given, ...rest } = response;
    const own: StoredResponse = rest;
    const statusMessage = capturedReasonPhrase(state, response.status);
    if (statusMessage !== undefined) own.statusMessage = statusMessage;
    this.completeWith(own);
  },
  abandon(finalStatus, reason = 'streaming') {
    abandon((this as CaptureHandle)[captureStateKey], finalStatus, reason);
  },
  failedWith(error) {
    const state = (this as CaptureHandle)[captureStateKey];
    // Kept for transactional mode, where it is the transaction's own store that failed (see
    // transactionOf). By name, so a copy of the package raised it as well.
    if (isStoreUnavailableError(error)) state.storeFailure = { error };
    if (!isBodyRefusal(error) || !refusesRequestBody(error as object, state.request)) return false;
    state.declined = 'body-refused';
    return true;
  },
  handlerReturned(onClosed, context) {
    const state = (this as CaptureHandle)[captureStateKey];
    state.returned = true;
    state.onClosed = onClosed as CaptureState['onClosed'];
    state.onClosedContext = context;
    // Closed before its head while the handler still worked, and the handler left nothing to end it.
    if (state.closedEarly && !state.ended) settleClosed(state, this);
  },
  handlerSettled() {
    const state = (this as CaptureHandle)[captureStateKey];
    if (state.answeredEarly !== undefined) settleAnsweredEarly(state);
  },
  answeredForHandler() {
    const state = (this as CaptureHandle)[captureStateKey];
    if (!state.ended) state.forHandler = true;
  },
  flush() {
    const state = (this as CaptureHandle)[captureStateKey];
    const res = state.res;
    restore(state);
    // A response destroyed meanwhile (closed before its head) takes nothing more.
    if (res.writableEnded || destroyedOf(res)) return;
    const head = state.headArgs ?? [state.status ?? res.statusCode];
    // A phrase set after the end, which the capture did not see.
    dropUnwritablePhrase(state, head);
    state.originalWriteHead.apply(res, head);
    res.end(Buffer.concat(state.chunks));
  },
  replace(response) {
    const state = (this as CaptureHandle)[captureStateKey];
    const res = state.res;
    restore(state);
    if (res.writableEnded || destroyedOf(res)) return;
    for (const name of res.getHeaderNames()) res.removeHeader(name);
    writeResponse(res, response);
  },
};

function abandon(state: CaptureState, status: number, reason: NotStoredReason) {
  if (state.ended) return;
  state.ended = true;
  restore(state);
  if (reason === 'streaming') unreplayable(state, reason, status);
  else finish(state, { kind: 'unstorable', reason, status });
}

// A response that went out (in full or in part) but cannot be stored, with the expiry its head
// announced: what the key's retries then get carries the same date (see `unreplayableResponse`).
function unreplayable(state: CaptureState, reason: 'too-large' | 'streaming', status: number) {
  const announced = state.res.getHeader(expiresHeader);
  const expires = typeof announced === 'string' ? announced : undefined;
  finish(state, { kind: 'unstorable', reason, status, expires });
}

// Whether a held response was kept whole, so that `flush()` can send it: not once its body went
// over maxResponseBytes, whose bytes the capture drops from there on (see `copy`).
function keptWhole(capture: ResponseCapture): boolean {
  return (capture as Partial<CaptureHandle>)[captureStateKey]?.overflow !== true;
}

// Takes back the `Idempotency-Expires` a held response announced (see transactionOf).
function withdrawExpiry(capture: ResponseCapture) {
  const state = (capture as Partial<CaptureHandle>)[captureStateKey];
  if (state !== undefined) withdrawAnnounced(state);
}

// Only the date this capture announced, while its head has not gone out: one the handler set itself
// is its own.
function withdrawAnnounced(state: CaptureState) {
  if (state.announced && !state.res.headersSent) state.res.removeHeader(expiresHeader);
}

function restore(state: CaptureState) {
  const res = state.res;
  res.writeHead = state.originalWriteHead as ServerResponse['writeHead'];
  res.write = state.originalWrite as ServerResponse['write'];
  res.end = state.originalEnd as ServerResponse['end'];
  if (state.originalDestroy !== undefined) res.destroy = state.originalDestroy as ServerResponse['destroy'];
  if (state.originalFlushHeaders !== undefined) {
    res.flushHeaders = state.originalFlushHeaders as ServerResponse['flushHeaders'];
  }
  if (state.timeoutEmitter !== undefined) state.timeoutEmitter.emit = state.originalEmit as Apply;
}

// `res.setTimeout(ms, callback)` makes `callback` a 'timeout' listener, called when the socket idles
// past `ms`: while the handler still runs, as a rule, and many Express snippets answer 503 there. That
// answer is not the handler's, which goes on and makes its effect unseen (Express never says when a
// handler ends): settled as the key's outcome, it was replayed for the retention, or under a policy
// that releases a 503 the retry ran the handler a second time, concurrently. An answer written while
// the 'timeout' is emitted (by any of its listeners, whenever and however added) is taken as
// `answeredForHandler` says; one written after an await in a listener is not. Only where the adapter
// cannot see the handler run (`CaptureOptions.handler`): where it can, an answer written while it
// runs is known for what it is already, and the key stays held until it ends.
// The emit is watched, not the listeners: wrapped, they were no longer the app's functions, so its
// `removeListener(callback)` removed nothing (a timeout answer taken back still went out) and a
// `once` listener stayed after it fired (and Node destroys a timed-out socket only when the response
// has no 'timeout' listener). Over HTTP/2 `res.setTimeout` puts the callback on the stream, whose
// 'timeout' also emits the response's: the stream's emit is watched there.
function watchTimeouts(state: CaptureState) {
  const emitter = (streamOf(state.res) ?? state.res) as unknown as { emit: Apply };
  state.timeoutEmitter = emitter;
  state.originalEmit = emitter.emit;
  emitter.emit = capturedEmit.bind(state);
}

function capturedEmit(this: CaptureState, event: unknown) {
  const emit = this.originalEmit as Apply;
  // biome-ignore lint/complexity/noArguments: every emit goes through here: no array made for its arguments.
  if (event !== 'timeout' || this.ended || this.forHandler) return Reflect.apply(emit, this.timeoutEmitter, arguments);
  // A listener that writes nothing (it logs, say) leaves the handler to answer for itself, as before:
  // the mark stays only when something was written while the listeners ran.
  const res = this.res;
  const { status, size } = this;
  const sent = res.headersSent;
  const destroyed = destroyedOf(res);
  this.forHandler = true;
  try {
    // biome-ignore lint/complexity/noArguments: as above.
    return Reflect.apply(emit, this.timeoutEmitter, arguments);
  } finally {
    if (!this.ended && this.status === status && this.size === size && res.headersSent === sent) {
      this.forHandler = false;
      // Cut without a word (`res.destroy()`), as Node cuts a timed-out socket nobody listens for: the
      // handler runs on, so its key stays held and its outcome is stored, as for Node's own cut. Taken
      // for a server that gave up on the response, the key was released while the handler ran, and
      // the client's retry ran it a second time, concurrently.
      if (!destroyed && destroyedOf(res)) this.cutByTimeout = true;
    }
  }
}

function capturedDestroy(this: CaptureState, ...args: unknown[]) {
  this.destroyedByServer = true;
  if (args[0] !== undefined && args[0] !== null) this.destroyedWithError = true;
  return (this.originalDestroy as Apply).apply(this.res, args);
}

function finish(state: CaptureState, value: CaptureResult) {
  if (state.outcome !== undefined) return;
  state.onEnd?.();
  state.outcome = value;
  state.resolveResult?.(value);
  if (state.onResult) state.settling = state.onResult(value);
}

// A Content-Length is digits (RFC 9110 8.6), around which a client ignores whitespace. Anything else
// declares no length: Number() would read '' and '  ' as 0, '0x6' as 6 and '1e1' as 10, and the
// body stored would be cut to (or judged short of) a length nobody declared.
const contentLengthValue = /^[ \t]*\d+[ \t]*$/;

function declaredLength(state: CaptureState): number | undefined {
  if (state.declared === null) {
    // With Transfer-Encoding the message is framed by it, whatever Content-Length says (RFC 9112
    // 6.3), and Node ignores the length too: the body is what the chunks carry.
    if ((state.headHeaders['transfer-encoding'] ?? state.res.getHeader('transfer-encoding')) !== undefined) {
      state.declared = undefined;
      return undefined;
    }
    const value = state.headHeaders['content-length'] ?? state.res.getHeader('content-length');
    // One header given as a one-item list is sent as that one header.
    const one = Array.isArray(value) && value.length === 1 ? value[0] : value;
    const text = typeof one === 'number' ? String(one) : one;
    state.declared =
      typeof text === 'string' && contentLengthValue.test(text) && Number.isSafeInteger(Number(text))
        ? Number(text)
        : undefined;
  }
  return state.declared;
}

function copy(state: CaptureState, chunk: unknown, encoding: unknown) {
  if (state.overflow || chunk === undefined || chunk === null || typeof chunk === 'function') return;
  const isString = typeof chunk === 'string';
  const bytes = isString
    ? Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8')
    : toBuffer(chunk, encoding);
  if (bytes === undefined || bytes.length === 0) return;
  state.size += bytes.length;
  if (state.size > state.maxBytes) {
    // Too large to store, so nothing more of it is kept, and what was is freed. Held too: the
    // outcome cannot be stored, so the transaction rolls back and a 503 goes out in its place (see
    // `keptWhole`), and kept until then, a body of any size would sit in memory whole while the
    // transaction is open (a 2 GiB export, the process). Held writes still answer true: the rest
    // is read and dropped, which ends the handler, and so the transaction, soonest.
    state.overflow = true;
    state.chunks.length = 0;
    return;
  }
  // A string was encoded into a fresh buffer already; a caller's buffer may be reused after the
  // write returns, so it is copied.
  state.chunks.push(isString ? bytes : Buffer.from(bytes));
}

/**
 * Announces, once, before the head goes out, until when the outcome is kept (`advertiseExpiry`):
 * not for a status the policy releases, nor over a value the handler set itself.
 */
function advertise(state: CaptureState, status: number) {
  const res = state.res;
  if (state.expires === undefined || state.eventStream || res.headersSent || res.hasHeader(expiresHeader)) return;
  // An answer written for a running handler is not the outcome: the policy's date for its status
  // says nothing of what the key keeps (see `answeredForRunning`).
  if (answeredForRunning(state)) return;
  // A live feed is never stored (see onHead), here too when its head is not written yet.
  if (declaresLiveFeed(res)) return;
  const value = state.expires(status);
  if (value === undefined) return;
  res.setHeader(expiresHeader, value);
  state.announced = true;
}

/**
 * Keeps the answer to a keyed request out of shared caches: `Cache-Control: no-store` on its head,
 * whatever its status, unless the response has a Cache-Control already (the handler's, or one an
 * earlier layer set): a handler that set one said what it wants. Without it, a cache that keeps POST
 * answers (nginx with `proxy_cache_methods POST`) kept Alice's first 201 and served it, her body and
 * her key echoed, to Bob's POST, whose handler never ran: a first execution is one caller's result
 * as much as its replay is (see `replay`). Set on the response only: Cache-Control is never
 * replayed (`neverReplayed`), so the record and the replays are what they were.
 *
 * Called wherever a head can leave: `writeHead`, the first write, `end` (held too, which covers the
 * flush). Node writes an implicit head through the `writeHead` on the response at that moment, the
 * original one once the wrappers are restored (`end`, the last declared byte), so the wrapper alone
 * would miss it. Headers passed to `writeHead` (Fastify passes all of its reply's there) replace one
 * set on the response, so a handler's own Cache-Control among them wins over this one, over HTTP/1.1
 * and HTTP/2 alike, and need not be looked for.
 */
function keepFromCaches(res: ServerResponse) {
  if (!res.headersSent && !res.hasHeader('cache-control')) res.setHeader('cache-control', 'no-store');
}

/**
 * True when a live feed's head has not been written yet and is about to leave with this write or end
 * (Express's res.send, Koa's string body, a write that reaches the declared length): the body is
 * settled before Node writes that head, so onHead must see it first, or the feed is stored as an
 * outcome. (Held mode calls onHead itself before it settles.)
 */
function liveFeedHeadPending(state: CaptureState): boolean {
  return state.status === undefined && !state.hold && declaresLiveFeed(state.res);
}

/** Server-sent events: a media type, never an outcome. */
const liveFeedType = /^text\/event-stream/i;

/** Whether the response's `Content-Type`, as set so far, is a live feed's. */
function declaresLiveFeed(res: ServerResponse): boolean {
  return liveFeedType.test(String(res.getHeader('content-type') ?? ''));
}

function onHead(state: CaptureState, args: unknown[]) {
  const status = Number(args[0]);
  state.status = status;
  state.headHeaders = args.length > 1 ? writeHeadHeaders(args) : noHeaders;
  const type = state.headHeaders['content-type'] ?? String(state.res.getHeader('content-type') ?? '');
  // Server-sent events are a live feed, not an outcome: never stored, and the key is freed at once
  // so the feed does not hold a lease open for as long as it streams. (In held mode nothing has
  // been sent: the transaction learns at once that it cannot be stored, and rolls back.) Held or
  // not, what it wrote is dropped: a held feed is answered 503 in its place, never flushed.
  if (liveFeedType.test(type)) {
    state.eventStream = true;
    state.chunks.length = 0;
    finish(state, { kind: 'unstorable', reason: 'event-stream', status });
  }
  advertise(state, status);
  keepFromCaches(state.res);
  ownKeyHeaders(state);
}

/**
 * `Idempotent-Replayed` and the `Idempotency-Key` echo are idem's to say on an answer to a keyed
 * request: a handler that passes on an upstream's headers (a proxy, an upstream that answers as
 * Stripe does) sent its first execution out marked as a replay, with the upstream's key in place of
 * the client's, and the client took a first run for a replay and might retry under a key it never
 * sent. The marker is dropped and the echo put back over the handler's, wherever a head can leave
 * (as keepFromCaches); {@link ownedHeadArgs} does the same for headers passed to `writeHead`.
 */
function ownKeyHeaders(state: CaptureState) {
  const res = state.res;
  if (res.headersSent) return;
  // Looked up first: most answers carry neither, and setting one that is there already costs more.
  if (res.hasHeader('idempotent-replayed')) res.removeHeader('idempotent-replayed');
  const echo = state.echo;
  if (echo !== undefined && state.declined === undefined && res.getHeader('idempotency-key') !== echo) {
    res.setHeader('idempotency-key', echo);
  }
}

/**
 * `writeHead`'s arguments with the headers passed there owned as {@link ownKeyHeaders} owns the
 * response's (Fastify passes all of its reply's there, and they replace the response's): the same
 * array when they name neither, else a copy without the marker and with the echo.
 */
function ownedHeadArgs(state: CaptureState, args: unknown[]): unknown[] {
  for (let i = 1; i < args.length; i++) {
    const arg = args[i];
    if (arg === null || typeof arg !== 'object') continue;
    const owned = Array.isArray(arg) ? ownedHeaderList(state, arg) : ownedHeaderObject(state, arg as object);
    if (owned === arg) return args;
    const copy = args.slice();
    copy[i] = owned;
    return copy;
  }
  return args;
}

// Names of 15 (`idempotency-key`) or 19 (`idempotent-replayed`) characters only are looked at twice.
function ownedName(name: string): 'key' | 'marker' | undefined {
  if (name.length === 15) return name.toLowerCase() === 'idempotency-key' ? 'key' : undefined;
  if (name.length === 19) return name.toLowerCase() === 'idempotent-replayed' ? 'marker' : undefined;
  return undefined;
}

function ownedHeaderObject(state: CaptureState, headers: object): object {
  let copy: Record<string, unknown> | undefined;
  for (const name of Object.keys(headers)) {
    const owned = ownedName(name);
    if (owned === undefined) continue;
    copy ??= { ...(headers as Record<string, unknown>) };
    delete copy[name];
    if (owned === 'key' && state.echo !== undefined && state.declined === undefined) copy[name] = state.echo;
  }
  return copy ?? headers;
}

function ownedHeaderList(state: CaptureState, list: unknown[]): unknown[] {
  let named = false;
  for (let i = 0; i + 1 < list.length && !named; i += 2) named = ownedName(String(list[i])) !== undefined;
  if (!named) return list;
  const out: unknown[] = [];
  for (let i = 0; i + 1 < list.length; i += 2) {
    const owned = ownedName(String(list[i]));
    if (owned === undefined) out.push(list[i], list[i + 1]);
    else if (owned === 'key' && state.echo !== undefined && state.declined === undefined) out.push(list[i], state.echo);
  }
  return out;
}

function capturedWriteHead(this: CaptureState, ...args: unknown[]) {
  // A second head, over one already sent (a timer's 503 while the handler streams): Node refuses it
  // (ERR_HTTP_HEADERS_SENT), so nothing of it is taken. Taken, its status was stored with the body
  // the handler sent under its own, and every retry was replayed a status its client never read.
  if (!this.hold && this.res.headersSent) return this.originalWriteHead.apply(this.res, args);
  args = ownedHeadArgs(this, args);
  dropUnwritablePhrase(this, args);
  onHead(this, args);
  if (this.hold) {
    this.headArgs = args;
    // Node's writeHead sets the response's status; a held head must too, or what reads it before
    // the flush (an adapter's `unrouted`, seeing a not-found handler's 404) sees the one before.
    const status = this.status as number;
    if (Number.isInteger(status) && status >= 100 && status <= 999) this.res.statusCode = status;
    return this.res;
  }
  this.headers ??= responseHeaders(this.res, this.headHeaders, this.replayed);
  const written = this.originalWriteHead.apply(this.res, args);
  // Node wrote the phrase into the head just now. (Not read over HTTP/2: see ownReasonPhrase.)
  if (streamOf(this.res) === undefined) this.sentPhrase = this.res.statusMessage;
  return written;
}

function capturedWrite(this: CaptureState, chunk: unknown, encoding?: unknown, callback?: unknown) {
  const res = this.res;
  // Past the last declared byte (see writeLast), which already settled the outcome.
  if (this.ended && !this.hold) return afterTail(this, this.originalWrite, chunk, encoding, callback);
  if (this.ended) return heldAfterEnd(callbackOf(encoding, callback, undefined));
  if (this.closedEarly && !this.hold) {
    streamedIntoClosed.call(this);
    return this.originalWrite.call(res, chunk, encoding, callback);
  }
  if (this.status === undefined && !this.hold) {
    // Node writes the implicit head inside write; capture status and headers now in case it does
    // not go through our writeHead (it does on current Node, this is belt and braces).
    if (liveFeedHeadPending(this)) onHead(this, [res.statusCode]);
    this.status = res.statusCode;
    advertise(this, res.statusCode);
    keepFromCaches(res);
    ownKeyHeaders(this);
    dropUnwritablePhrase(this);
    this.headers ??= responseHeaders(res, this.headHeaders, this.replayed);
  }
  if (!this.eventStream) copy(this, chunk, encoding);
  if (this.hold) {
    if (this.status === undefined) onHead(this, [res.statusCode]);
    const cb = typeof encoding === 'function' ? encoding : callback;
    if (typeof cb === 'function') process.nextTick(cb as () => void);
    // Held too, a response framed by its Content-Length is whole at its last declared byte (see
    // writeLast): a handler may never call end(), and waiting for it held the answer, and the
    // transaction, until maxExecution gave up on a handler that had answered.
    const length = this.eventStream ? undefined : declaredLength(this);
    if (length !== undefined && this.size >= length) capturedEnd.call(this);
    return true;
  }
  if (!this.eventStream) {
    const length = declaredLength(this);
    const bytes = length === undefined ? undefined : toBuffer(chunk, encoding);
    if (length !== undefined && bytes !== undefined && bytes.length > 0) {
      this.passed += bytes.length;
      if (this.passed >= length) return writeLast(this, bytes, typeof encoding === 'function' ? encoding : callback);
    }
  }
  const [bytes, as] = inLatin1Head(this, chunk, encoding);
  return this.originalWrite.call(res, bytes, as, callback);
}

/**
 * The first chunk handed down to Node, made so that the head leaves in Latin-1. Node sends the head
 * together with the first string it is given to write in UTF-8 (or with no encoding, as Express's
 * `res.send`, Fastify's reply and Koa write a text or JSON body): joined into that one string, each
 * character U+0080..U+00FF of its reason phrase and header values went out as two UTF-8 bytes, where
 * any other head (before a Buffer body, an end with none, a held answer's flush, every replay) goes
 * out in Latin-1, one byte each. The replay of such an answer said `Créé` where its first answer
 * said `CrÃ©Ã©` (spec: a replay is the original response). Only a head with such a character is
 * concerned: its first string chunk goes down as its bytes (the same bytes), so the head leaves in
 * Latin-1, as the stored record replays it. Anything else goes as it came. Not over HTTP/2, whose
 * head is no string. (A chunked write of a string that is not empty was never concerned: Node sends
 * its size first, in Latin-1, and the head with it; made bytes, it goes out the same. Joined to the
 * body's string are the head of an end(string), of a write framed by a Content-Length or on an
 * HTTP/1.0 connection, and of an empty write.)
 */
function inLatin1Head(state: CaptureState, chunk: unknown, encoding: unknown): [unknown, unknown] {
  if (state.headLeft) return [chunk, encoding];
  state.headLeft = true;
  // Node joins the head to a string written with 'utf8', 'latin1' or no encoding (an empty one, null
  // or a callback in its place), and sends it apart, in Latin-1, with any other ('utf-8' too). An
  // empty string is joined as well: a first write('') sent the head in UTF-8.
  if (typeof chunk !== 'string' || (typeof encoding === 'string' && encoding !== '' && encoding !== 'utf8'))
    return [chunk, encoding];
  if (streamOf(state.res) !== undefined || !headHasLatin1(state)) return [chunk, encoding];
  return [Buffer.from(chunk, 'utf8'), typeof encoding === 'function' ? encoding : undefined];
}

// Node's flushHeaders sends the head as a string with no encoding: in UTF-8 (see inLatin1Head). One
// with a character U+0080..U+00FF is sent as Node's own end() sends a head with no body: its `_send`
// of an empty string in Latin-1. That is flushHeaders itself with the encoding named, so it goes out
// now, for a 204, a 304 or a HEAD too (Node takes no body write for them, so an empty write would
// hold it back to the end). Off Node (no `_send`), the runtime's own flushHeaders. Asked after a
// write too: one to a response with no body did not send the head (Node dropped it), this flush does;
// once the head has left, `_send` of an empty string sends nothing, as Node's flushHeaders then.
function capturedFlushHeaders(this: CaptureState) {
  const res = this.res;
  const original = this.originalFlushHeaders as Apply;
  if (this.ended) return original.call(res);
  // What Node's flushHeaders does first (`_implicitHeader`), through the capture's writeHead.
  if (!res.headersSent) res.writeHead(res.statusCode);
  this.headLeft = true;
  const send = (res as unknown as { _send?: unknown })._send;
  if (typeof send !== 'function' || !headHasLatin1(this)) return original.call(res);
  send.call(res, '', 'latin1');
}

// Held, nothing leaves before the commit: the head is the capture's, held with the rest. Node's own
// flushHeaders wrote its implicit head through the capture's writeHead, as `writeHead(statusCode)`,
// over one the handler had written: `writeHead(201, 'Created Fine', { location })` then
// `flushHeaders()` went out, and was stored, as a bare `201 Created`, without the headers given.
// Only a response with no head yet takes the implicit one, as Node's does.
function heldFlushHeaders(this: CaptureState) {
  if (this.headArgs === undefined && !this.ended) this.res.writeHead(this.res.statusCode);
}

const latin1Chars = /[\u0080-\u00ff]/;

// Whether the head about to leave has a character U+0080..U+00FF: its reason phrase, the headers
// set on the response, or those given to writeHead. Asked of every response whose first chunk is a
// string (each of Koa's text and JSON bodies), so it allocates no more than the list of names:
// `getHeaders()` copies every header into a new object (with `Object.values`, a new array and a
// closure per list too), about three times the cost of looking each name up (1.1 µs against 0.3 µs
// for seven headers on the 2-core box).
function headHasLatin1(state: CaptureState): boolean {
  const res = state.res;
  const phrase = res.statusMessage;
  if (typeof phrase === 'string' && latin1Chars.test(phrase)) return true;
  const head = state.headHeaders;
  for (const name in head) if (latin1Chars.test(head[name] as string)) return true;
  const names = res.getHeaderNames();
  for (let i = 0; i < names.length; i++) {
    const value = res.getHeader(names[i] as string);
    if (typeof value === 'string') {
      if (latin1Chars.test(value)) return true;
    } else if (Array.isArray(value)) {
      for (let j = 0; j < value.length; j++) if (latin1Chars.test(value[j] as string)) return true;
    }
  }
  return false;
}

// With a Content-Length the client has the whole response once the last declared byte arrives,
// whether or not `end` follows (a handler may never call it, and the client would wait for a byte
// held back for it): the response is settled here, as by `end`, and that byte leaves once the
// outcome is stored, so a client that retries the moment it has it finds the replay.
function writeLast(state: CaptureState, bytes: Buffer, callback: unknown): boolean {
  const res = state.res;
  if (answeredForRunning(state)) {
    answeredEarly(state);
    return state.originalWrite.call(res, bytes, callback) as boolean;
  }
  state.ended = true;
  const declined = state.declined ?? (state.unrouted?.() ? 'no-route' : undefined);
  const status = state.status ?? res.statusCode;
  // The head is out: the echo stays on a declined answer, which is still not stored.
  if (declined !== undefined) finish(state, { kind: 'unstorable', reason: declined, status });
  else settleWritten(state);
  const settling = state.settling;
  if (settling === undefined) {
    restore(state);
    return state.originalWrite.call(res, bytes, callback) as boolean;
  }
  state.tail = Buffer.from(bytes.subarray(bytes.length - 1));
  if (bytes.length === 1 && !res.headersSent) {
    // The whole body is this byte: the head waits with it (see headAsNow).
    const putBack = headAsNow(res);
    void settling.then(() => {
      putBack();
      writeTail(state, callback);
    });
    return true;
  }
  void settling.then(() => writeTail(state, callback));
  if (bytes.length === 1) return true;
  return state.originalWrite.call(res, bytes.subarray(0, bytes.length - 1)) as boolean;
}

// The held last byte, once the outcome is stored; the wrappers go with it.
function writeTail(state: CaptureState, callback: unknown) {
  const tail = state.tail;
  state.tail = undefined;
  restore(state);
  if (tail !== undefined) state.originalWrite.call(state.res, tail, callback);
}

// A write or end after a held response ended: taken as Node takes one after its end, a no-op. Let
// through, it reached Node while the answer was still held: Node sent an empty answer of the status
// at hand, and the committed one, which the retries replay, never went out.
function heldAfterEnd(callback: unknown): boolean {
  if (typeof callback === 'function') process.nextTick(callback as () => void);
  return true;
}

// A write or end after the last declared byte: behind that byte while it is held.
function afterTail(state: CaptureState, original: Apply, chunk: unknown, encoding: unknown, callback: unknown) {
  const settling = state.settling;
  if (state.tail === undefined || settling === undefined) return original.call(state.res, chunk, encoding, callback);
  void settling.then(() => original.call(state.res, chunk, encoding, callback));
  return original === state.originalEnd ? state.res : true;
}

// The outcome of a response whose every byte is known: the response, or too large to store, or cut
// short of the length its head declared.
function settleWritten(state: CaptureState) {
  const res = state.res;
  const finalStatus = state.status ?? res.statusCode;
  if (state.overflow) unreplayable(state, 'too-large', finalStatus);
  else if (cutShort(state, finalStatus)) unreplayable(state, 'streaming', finalStatus);
  else if (!state.eventStream) {
    // One chunk is already a private copy (see `copy`): no need to copy it again.
    const chunks = state.chunks;
    const written = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks);
    const headers = state.headers ?? responseHeaders(res, state.headHeaders, state.replayed);
    const response: StoredResponse = { status: finalStatus, headers, body: asFramed(state, written) };
    const statusMessage = capturedReasonPhrase(state, finalStatus);
    if (statusMessage !== undefined) response.statusMessage = statusMessage;
    finish(state, { kind: 'complete', response });
  }
}

/**
 * The reason phrase the response went out with (or goes out with, held), when it is not the one Node
 * sends for the status by default: given to `writeHead(status, reason)` or set as `statusMessage`
 * (Express `res.statusMessage`, Koa `ctx.message`, Fastify `reply.raw.statusMessage`). Stored with
 * the response, so its replays say it too. None over HTTP/2, which has no reason phrase.
 */
function capturedReasonPhrase(state: CaptureState, status: number): string | undefined {
  const given = state.headArgs?.[1];
  if (typeof given === 'string') return phraseOfOwn(state.res, given, status);
  // A head already written: a phrase set after it (res.statusMessage once flushHeaders() or a first
  // write sent it) went out on no status line, and its replays must not say it either.
  if (state.sentPhrase !== undefined) return phraseOfOwn(state.res, state.sentPhrase, status);
  return ownReasonPhrase(state.res, status);
}

/**
 * The reason phrase `res` would go out with for `status` (its `statusMessage`: Express
 * `res.statusMessage`, Koa `ctx.message`, Fastify `reply.raw.statusMessage`), when it is the
 * handler's own rather than the one Node sends by default; undefined otherwise, for one Node cannot
 * write (idem drops it: see `IDEM_UNWRITABLE_REASON_PHRASE`), and over HTTP/2, which has none. An
 * adapter that settles an outcome from what the handler left calls
 * {@link ResponseCapture.completeAsWritten}, which takes the phrase so.
 *
 * @example
 * const phrase = ownReasonPhrase(res, 201); // 'Created Fine', or undefined for 'Created'
 */
export function ownReasonPhrase(res: ServerResponse, status: number): string | undefined {
  // Not read over HTTP/2: Node's Http2ServerResponse warns (UnsupportedWarning) when it is.
  if (streamOf(res) !== undefined) return undefined;
  return phraseOfOwn(res, res.statusMessage, status);
}

function phraseOfOwn(res: ServerResponse, reason: unknown, status: number): string | undefined {
  if (streamOf(res) !== undefined) return undefined;
  // Node sends the default for an empty or missing one (`statusMessage ||= STATUS_CODES[status]`).
  if (typeof reason !== 'string' || reason === '' || reason === defaultReasonPhrases()[status]) return undefined;
  // One Node refuses to write never goes out (see dropUnwritablePhrase), so none is replayed either.
  return isFieldValue(reason) ? reason : undefined;
}

/**
 * Drops a reason phrase of the handler's own that Node refuses to write: one that is no field value
 * (a line break, a control character, a character above U+00FF). Node's `writeHead` throws
 * `ERR_INVALID_CHAR` on it when the head leaves, after the handler made its effect: the framework
 * answered 500 in place of the handler's status (Fastify answered nothing, the client waiting), the
 * outcome was refused by the store, and the key released, so a retry ran the handler again. Dropped,
 * the head goes out with the status and its default phrase, the outcome is stored as any other, and
 * its replays say the same. Given `head` (a `writeHead` call's arguments, or the held one's), a phrase
 * among them is dropped too, and a writable one there is what goes out, whatever `statusMessage` says.
 * Called wherever a head can leave, as keepFromCaches is. Nothing over HTTP/2, which has no phrase.
 */
function dropUnwritablePhrase(state: CaptureState, head?: unknown[]) {
  const res = state.res;
  // A held writeHead's arguments count as given: its phrase is the one that will go out.
  const args = head ?? state.headArgs;
  if (streamOf(res) !== undefined) return;
  let dropped = false;
  const phrase = args?.[1];
  const given = typeof phrase === 'string';
  if (given && !isFieldValue(phrase)) {
    // writeHead(status, headers) is what remains, as Node takes it.
    args?.splice(1, 1);
    dropped = true;
  }
  // A writable phrase given to writeHead replaces the one set before (Node sets statusMessage to it):
  // that one never goes out, so nothing is dropped or said.
  const own: unknown = given && !dropped ? undefined : res.statusMessage;
  if (typeof own === 'string' && !isFieldValue(own)) dropped = true;
  if (!dropped) return;
  // Empty, Node sends the status's default (an own phrase set before a dropped writeHead one too).
  res.statusMessage = '';
  state.unwritablePhrase();
}

// Node's table of default phrases, looked up when a response is stored rather than imported: this
// module loads on runtimes without node:http (the engine on Workers).
let reasonPhrases: Readonly<Record<number, string | undefined>> | undefined;
function defaultReasonPhrases(): Readonly<Record<number, string | undefined>> {
  reasonPhrases ??=
    (process.getBuiltinModule?.('node:http') as typeof import('node:http') | undefined)?.STATUS_CODES ?? {};
  return reasonPhrases;
}

/**
 * The body as its client read it: a handler that wrote past its `Content-Length` had Node send the
 * extra bytes, but the client's message ended at the declared length (what follows is garbage on the
 * connection, which it then drops). Stored whole, the replay would be longer than the answer the
 * first caller got, framed by a length no one declared.
 */
function asFramed(state: CaptureState, body: Buffer): Buffer {
  const length = declaredLength(state);
  return length !== undefined && body.length > length ? body.subarray(0, length) : body;
}

/**
 * True when a response ended with fewer body bytes than its `Content-Length` (a source that ended
 * early behind a length set from a `stat`, a file that shrank under `sendFile`, a handler's wrong
 * count). Node sends what it has and the client waits for the rest: it never received a whole
 * message. Stored, the short body would replay framed by its own length, as if it were the whole
 * answer; it is settled as a streamed body cut short instead. A 204 or 304 has no body whatever its
 * length says (a 304's is the length of the representation it stands for), and a live feed is no
 * outcome anyway.
 */
function cutShort(state: CaptureState, status: number): boolean {
  if (state.eventStream || status === 204 || status === 304 || status < 200) return false;
  const length = declaredLength(state);
  return length !== undefined && state.size < length;
}

function capturedEnd(this: CaptureState, chunk?: unknown, encoding?: unknown, callback?: unknown) {
  const res = this.res;
  if (this.ended && this.hold) {
    heldAfterEnd(callbackOf(chunk, encoding, callback));
    return res;
  }
  if (this.ended) return afterTail(this, this.originalEnd, chunk, encoding, callback);
  // What Node cannot write (a number, an object) it refuses at the call, and so does this end, before
  // the response counts as ended: deferred behind the store's answer, Node's throw would be an
  // unhandled rejection (the end of a Node process) and the outcome stored with an empty body.
  if (chunk && typeof chunk !== 'string' && typeof chunk !== 'function' && !(chunk instanceof Uint8Array)) {
    return this.originalEnd.call(res, chunk, encoding, callback);
  }
  // Before any of the ends below: each leaves through Node's own writeHead (the wrappers restored).
  // After whatever cleared the headers on the way (Koa's error handler removes every one).
  keepFromCaches(res);
  dropUnwritablePhrase(this);
  const declined = this.declined ?? (this.unrouted?.() ? 'no-route' : undefined);
  if (declined !== undefined) return endDeclined(this, declined, chunk, encoding, callback);
  ownKeyHeaders(this);
  if (answeredForRunning(this)) {
    if (!this.hold) return endAnsweredEarly(this, chunk, encoding, callback);
    // Held, the transaction reads the mark once the end is known and rolls back (see transactionOf):
    // a timeout's answer (Koa's koa-timeout above idempotency()) is no outcome of the handler's, and
    // stored it was replayed for the retention though nothing of the operation committed.
    this.forHandler = true;
  }
  // A response ended without a head of its own (Express's res.send): its head leaves with the end.
  if (liveFeedHeadPending(this)) onHead(this, [res.statusCode]);
  advertise(this, this.status ?? res.statusCode);
  this.ended = true;
  if (!this.eventStream) copy(this, chunk, encoding);
  if (this.hold) {
    if (this.status === undefined) onHead(this, [res.statusCode]);
    const cb = callbackOf(chunk, encoding, callback);
    if (typeof cb === 'function') process.nextTick(cb as () => void);
  } else {
    restore(this);
  }
  settleWritten(this);
  // The end goes out once the outcome is stored: at once when the store answered at once.
  if (!this.hold) sendEnd(this, chunk, encoding, callback);
  return res;
}

// The answer of a request no route took (see `unrouted`), or of one whose body the parser refused
// (see `failedWith`): served as written, never stored, and the key released. As for a stored
// outcome, the end leaves once the key is released: a client retrying the moment it reads the
// answer must find the key free, not in progress (409).
function endDeclined(
  state: CaptureState,
  reason: 'no-route' | 'body-refused',
  chunk: unknown,
  encoding: unknown,
  callback: unknown,
) {
  const res = state.res;
  // The key played no part in this answer (as on Fastify, which never claims for an unmatched route
  // or a body its parser refused).
  if (!res.headersSent) res.removeHeader('idempotency-key');
  withdrawAnnounced(state);
  const status = state.status ?? res.statusCode;
  if (state.hold) {
    // The last chunk joins what waits in the capture. It all goes out when the transaction has
    // rolled back and the key is released (see `transactionOf`), as a stored outcome goes out once
    // committed.
    copy(state, chunk, encoding);
    abandon(state, status, reason);
    const done = callbackOf(chunk, encoding, callback);
    if (typeof done === 'function') res.once('finish', done as () => void);
    return res;
  }
  abandon(state, status, reason);
  sendEnd(state, chunk, encoding, callback);
  return res;
}

/**
 * Sends an end once the outcome is settled: at once when the store answered at once, or once it has,
 * with the head as it was at `end()` (see headAsNow): a status, phrase or header set right after
 * `end()` (a handler's line below its end, a logger's hook) does not go out, as with Node.
 */
function sendEnd(state: CaptureState, chunk: unknown, encoding: unknown, callback: unknown) {
  const settling = state.settling;
  if (settling === undefined) {
    endNow(state, chunk, encoding, callback);
    return;
  }
  const putBack = state.res.headersSent ? undefined : headAsNow(state.res);
  guardUntilEnd(state, settling);
  void settling.then(() => {
    restore(state);
    putBack?.();
    endLater(state, chunk, encoding, callback);
  });
}

/**
 * Until a held end goes out, takes what follows it as Node takes it after its end. Let through to
 * Node, a `write()` sent its chunk (and the head) ahead of the held end: the first client read `ba`
 * for `end('a'); write('b')`, where Node sends `a` and refuses the write, and the record and every
 * replay said `a`. A write or end now waits for the held end and meets it there as Node's own would
 * (ERR_STREAM_WRITE_AFTER_END); a `writeHead()` throws, as Node's does once `end()` wrote the head.
 */
function guardUntilEnd(state: CaptureState, settling: Promise<unknown>) {
  const res = state.res;
  res.write = ((chunk: unknown, encoding: unknown, callback: unknown) => {
    void settling.then(() => state.originalWrite.call(res, chunk, encoding, callback));
    return false;
  }) as ServerResponse['write'];
  res.end = ((chunk: unknown, encoding: unknown, callback: unknown) => {
    void settling.then(() => state.originalEnd.call(res, chunk, encoding, callback));
    return res;
  }) as ServerResponse['end'];
  res.writeHead = (() => {
    throw Object.assign(new Error('Cannot write headers after they are sent to the client'), {
      code: 'ERR_HTTP_HEADERS_SENT',
    });
  }) as ServerResponse['writeHead'];
}

/**
 * Keeps the head of a response whose head has not left yet, for when it does: the returned function
 * puts the status, phrase and headers back as they are now, unless the head left meanwhile. An end
 * (or the last declared byte) held until the outcome is stored writes its head later, from whatever
 * the response says then, where Node would have written it at once; what is set, changed or removed
 * in between went out on the first answer while the record kept the head as it was, and every
 * replay said that. A copy per held head only: this path waits on a store anyway.
 */
function headAsNow(res: ServerResponse): () => void {
  const status = res.statusCode;
  // Not read over HTTP/2, which has no phrase (Node warns on the read: see ownReasonPhrase).
  const h1 = streamOf(res) === undefined;
  const phrase = h1 ? res.statusMessage : undefined;
  const headers = res.getHeaders();
  return () => {
    if (res.headersSent) return;
    res.statusCode = status;
    if (h1) res.statusMessage = phrase as string;
    putHeadersBack(res, headers);
  };
}

// Makes the response's headers those of `headers` (a getHeaders() copy): the ones added since are
// removed, the ones changed or removed since are set again.
function putHeadersBack(res: ServerResponse, headers: OutgoingHttpHeaders) {
  for (const name of res.getHeaderNames()) {
    if (!Object.hasOwn(headers, name)) res.removeHeader(name);
  }
  for (const name of Object.keys(headers)) {
    const value = headers[name];
    if (value !== undefined && res.getHeader(name) !== value) res.setHeader(name, value);
  }
}

// Sends the end that capturedEnd held back.
function endNow(state: CaptureState, chunk: unknown, encoding: unknown, callback: unknown) {
  // Node's end('') writes nothing and sends the head in Latin-1 itself; an empty Buffer in its place
  // would be a write, which a server with `rejectNonStandardBodyWrites` refuses on a 204 or a HEAD.
  const [bytes, as] = chunk === '' ? [chunk, encoding] : inLatin1Head(state, chunk, encoding);
  state.originalEnd.call(state.res, bytes, as, callback);
}

// The end deferred behind the store's answer. Node can still refuse it there: with
// `res.strictContentLength` an end short of (or past) the declared length throws
// ERR_HTTP_CONTENT_LENGTH_MISMATCH. The handler that called end() has moved on and cannot catch it;
// thrown here it would be an unhandled rejection (the end of a Node process) and the response would
// stay open, its client waiting for bytes that never come. The response is destroyed instead, as a
// stream that failed; its outcome was settled before (a short body as cut short).
function endLater(state: CaptureState, chunk: unknown, encoding: unknown, callback: unknown) {
  try {
    endNow(state, chunk, encoding, callback);
  } catch {
    state.res.destroy();
  }
}

// Asked only when the response ends: is this an answer someone else wrote for a handler that still
// runs (see `CaptureOptions.handler` and `answeredForHandler`)?
function answeredForRunning(state: CaptureState): boolean {
  if (state.forHandler) return true;
  const handler = state.handler;
  return handler?.running === true && !handler.writesItself();
}

// Marks the response ended by an answer for a running handler. Where the adapter sees the handler's
// end, the settlement waits for it (`handlerSettled`), so the key stays held while it runs; where it
// cannot (`answeredForHandler`), it is settled now.
function answeredEarly(state: CaptureState) {
  state.ended = true;
  state.answeredEarly = state.status ?? state.res.statusCode;
  state.chunks.length = 0;
  restore(state);
  if (state.forHandler) settleAnsweredEarly(state);
}

// An answer written for a running handler (see `answeredForRunning`). Not stored, and no expiry
// announced on it (see `advertise`): it is not the outcome. Waiting for the handler, it goes out at once: that is the timeout's point,
// and the key stays held meanwhile. Settled now, it goes out once the key is kept, as any outcome, so
// a retry that comes the moment it is read gets the replay, not a 409.
function endAnsweredEarly(state: CaptureState, chunk: unknown, encoding: unknown, callback: unknown) {
  answeredEarly(state);
  sendEnd(state, chunk, encoding, callback);
  return state.res;
}

function settleAnsweredEarly(state: CaptureState) {
  finish(state, { kind: 'unstorable', reason: 'answered-early', status: state.answeredEarly as number });
}

function onCapturedClose(this: CaptureState) {
  if (this.ended) return;
  // Told the handler runs on (connect-timeout), then closed: the timeout could not write its answer
  // over a head already sent, and Express destroyed the socket. Still no outcome of the handler's.
  if (this.forHandler) {
    answeredEarly(this);
    return;
  }
  const res = this.res;
  if (res.headersSent || this.status !== undefined) {
    unreplayable(this, 'streaming', this.status ?? res.statusCode);
    return;
  }
  // Closed before its head. A client that left while the handler works: the handler ends the
  // response, and its outcome is stored though nobody reads it (the client finds it when it
  // retries). But a response the server destroyed (a failed pipeline, `res.destroy()`, a framework
  // giving up on a failed body stream) is never ended, while the heartbeat would renew its lease
  // for as long as the process lives and every retry got 409: it is given up now. So is one closed
  // once the handler returned and the framework itself was writing, unless what the handler left
  // settles it (its client left: the outcome stands, and a retry must get it, not run again).
  if (destroyedByServer(this)) {
    // Destroyed by a failure while the handler answered (its body stream failed before the first
    // chunk: Express's or Koa's pipeline): the operation ran, so its key must not run it again. Kept
    // as a streamed response cut short, as one that fails after its head is. Destroyed without a
    // word and with no body handed over, the handler gave nothing: the key is released.
    if (failedWhileAnswering(this)) unreplayable(this, 'streaming', this.status ?? res.statusCode);
    else giveUp(this);
  } else if (this.returned) settleClosed(this, this.handle as ResponseCapture);
  else if (livePipeInto(res)) {
    // Its client left while a body stream piped into it had yet to give its first chunk (a slow
    // upstream). Nothing will end it: `stream.pipeline` fails now with a premature close and
    // destroys the source, `source.pipe(res)` unpipes it, and no write ever comes. The handler ran
    // and handed its body over, so its key must not run it again: settled now as a stream cut short.
    abandon(this, this.status ?? res.statusCode, 'streaming');
  } else {
    this.closedEarly = true;
    // Held, every write is taken (kept, or dropped past the limit) and the pipe never stalls: its
    // end settles the response.
    if (!this.hold) res.once('pipe', streamedIntoClosed.bind(this));
  }
}

// A response streamed to a client that left before its head went out: a stream piped into it
// (Express's `stream.pipe(res)`, Fastify's `reply.send(stream)`, caught at 'pipe'), or any write
// after the close (`stream.pipeline(source, res)`, a web stream's `pipeTo`, a handler writing in
// pieces), caught in capturedWrite. A destroyed response never drains, so a pipe stalls at its
// first write and a pipeline fails, and neither ends it: waited for, the key would stay in progress
// for as long as the process lives. The handler ran, so its key must not run again, and what it
// answered cannot be known in full: settled as a streamed response cut short, as when the client
// leaves after the head. A response ended whole (`res.end(body)`, `res.json()`) is stored as usual.
function streamedIntoClosed(this: CaptureState) {
  if (!this.ended) abandon(this, this.status ?? this.res.statusCode, 'streaming');
}

const pipedKey = Symbol('idem piped');

// The last body stream piped into a response ('pipe' hands it over), kept on the response itself so
// that one listener serves every response, not a closure per request.
type Piped = ServerResponse & { [pipedKey]?: PipedSource };

type PipedSource = { destroyed?: boolean; readableEnded?: boolean; errored?: unknown } | true;

function markPiped(this: Piped, source: unknown) {
  this[pipedKey] = typeof source === 'object' && source !== null ? (source as PipedSource) : true;
}

// The source stays marked as once piped (a destroy after it is still a failed answer), but is no
// longer held: what `livePipeInto` asks is whether a body stream is piped into the response now.
// Only a response still open forgets it: the unpipe a close brings (over HTTP/2 before the
// response's own 'close' is seen) is the pipe stopping with it, which `livePipeInto` is about.
function markUnpiped(this: Piped, source: unknown) {
  if (this[pipedKey] === source && !destroyedOf(this)) this[pipedKey] = true;
}

/**
 * Whether a body stream piped into the response is still live: neither destroyed (failed, or torn
 * down by a pipeline) nor ended. One that failed before the close is over, and the handler may answer
 * whole after it (a cached file missing, the answer built instead); one that ended has ended the
 * response too, or handed it back to the handler (`{ end: false }`).
 */
function livePipeInto(res: ServerResponse): boolean {
  const source = (res as Piped)[pipedKey];
  if (source === undefined || source === true) return false;
  return source.destroyed !== true && source.readableEnded !== true && (source.errored ?? null) === null;
}

/**
 * Whether the server destroyed the response, before its head, while the handler was answering: with
 * an error (`stream.pipeline(source, res)` and Koa's respond destroy it with the source's, a web
 * stream's `pipeTo` aborts it with it, a handler's `res.destroy(error)`), or after a body stream was
 * piped into it (a handler's own `source.on('error', () => res.destroy())`). Not a client that left:
 * its close destroys no response with an error (HTTP/1.1's `errored` stays null, and a pipeline
 * that fails then finds the response destroyed already; over HTTP/2 only the server's own `destroy`
 * is counted, as a client's RST_STREAM can carry an error code).
 */
function failedWhileAnswering(state: CaptureState): boolean {
  const piped = (state.res as Piped)[pipedKey] !== undefined;
  if (state.originalDestroy !== undefined) return state.destroyedByServer && (state.destroyedWithError || piped);
  const errored = erroredOf(state.res);
  return errored !== state.erroredAtStart && (piped || (errored !== undefined && errored !== null));
}

// An Http2ServerResponse (Node's HTTP/2 compatibility API, which Fastify's `http2: true` and a Koa
// app on `http2.createServer` write to) has neither `errored` nor `destroyed`; its stream has both.
// A client's RST_STREAM (CANCEL) destroys the stream without an error, as a client leaving an
// HTTP/1.1 connection does; a failed pipeline into the response destroys it with one.
// Only an Http2ServerResponse has a `stream`: its presence is what says a response is HTTP/2.
function streamOf(res: ServerResponse): Readable | undefined {
  return (res as { stream?: Readable }).stream;
}

// Compared as it is: a ServerResponse's `errored` is null until `destroy()`, which sets it to its
// argument, undefined too, so `destroy()` without an error shows as well.
function erroredOf(res: ServerResponse): Error | null | undefined {
  return 'errored' in res ? res.errored : streamOf(res)?.errored;
}

/**
 * Whether the client is gone: its connection (or, over HTTP/2, its stream) closed. An adapter asks
 * once its key is claimed: a client that left while the claim waited on a slow store gets no handler
 * (body parsers skip a request whose socket is gone, so it would run without the body it sent); the
 * key is released and the retry runs as the first attempt would have.
 *
 * @example
 * if (clientLeft(req, res)) return void (await http.engine.release(lease));
 */
export function clientLeft(req: IncomingMessage, res: ServerResponse): boolean {
  return destroyedOf(res) || req.socket?.destroyed === true;
}

/**
 * Whether the response can take no more: destroyed, or, over HTTP/2, its stream is.
 *
 * @example
 * if (destroyedOf(ctx.res)) return; // the client reset its stream
 */
export function destroyedOf(res: ServerResponse): boolean {
  return res.destroyed === true || streamOf(res)?.destroyed === true;
}

// Whether the server destroyed the response (`res.destroy()`, a failed pipeline), as opposed to a
// client that left; a timeout listener's cut counts as the latter (see `cutByTimeout`).
function destroyedByServer(state: CaptureState): boolean {
  return (erroredOf(state.res) !== state.erroredAtStart || state.destroyedByServer) && !state.cutByTimeout;
}

function settleClosed(state: CaptureState, capture: ResponseCapture) {
  if (state.onClosed !== undefined && !destroyedByServer(state)) {
    state.onClosed(state.onClosedContext, capture);
  }
  if (!state.ended) giveUp(state);
}

function giveUp(state: CaptureState) {
  abandon(state, state.status ?? state.res.statusCode, 'closed');
}

// A handler's mistake that would otherwise show only as a replay of what it said must not be kept.
// Said once per instance.
const lateReleaseWarning =
  'release() was called after the response ended, so it changed nothing: the outcome was already settled (stored, unless the policy released it). Call it before the response ends.';

// A reason phrase Node refuses to write (see dropUnwritablePhrase). Said once per instance.
const unwritablePhraseWarning =
  'A handler set a reason phrase Node cannot write (a line break, a control character, or a character above U+00FF): it was dropped, and the response went out, was stored and is replayed with its status and the default phrase. Set a phrase of visible ASCII, or none.';

// A configuration mistake: a route given its own instance (for its own retention, say) behind an
// app-wide one, whose settings then apply. Said once per instance, with what to change.
const stackedWarning =
  'Two idempotency middlewares handle one request: the first one governs it and the second steps aside, so its settings do not apply. Mount one instance per route: give a route its own instance only where no app-wide one runs.';
