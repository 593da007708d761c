import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { isBodyRefusal, type RequestBodyFacts, refusesRequestBody } from './body-refusal.js';
import { isStoreUnavailableError } from './errors.js';
import type { NotStoredReason } from './events.js';
import { isFieldValue } from './header-syntax.js';
import { expiresHeader } from './http-options.js';
import type { CaptureOptions, CaptureResult, ResponseCapture, RunningHandler } from './http-types.js';
import { headerRecord, writeResponse } from './http-write.js';
import { livePipeInto, markPiped, markUnpiped, type Piped, pipedKey } from './pipe-marks.js';
import { ownReasonPhrase, phraseOfOwn } from './reason-phrase.js';
import { destroyedOf, erroredOf, streamOf } from './response-state.js';
import type { StoredResponse } from './store.js';

function toBuffer(chunk: unknown, encoding: unknown): Buffer | undefined {
  if (chunk === undefined || chunk === null || typeof chunk === 'function') return undefined;
  if (typeof chunk === 'string')
    return Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return undefined;
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

/** The headers a replay may carry, as a list to walk and a set to test. */
export interface ReplayedHeaders {
  readonly names: readonly string[];
  readonly allow: ReadonlySet<string>;
}

// The headers of a response: those set on it, then those passed to writeHead (which Node may not
// copy onto the response).
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
export function captureResponse(
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

export const captureStateKey = Symbol('capture state');

export type CaptureHandle = ResponseCapture & { [captureStateKey]: CaptureState };

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

export function headWentOut(capture: ResponseCapture): boolean {
  const state = (capture as Partial<CaptureHandle>)[captureStateKey];
  return state !== undefined && !state.hold && state.res.headersSent;
}

export function keptWhole(capture: ResponseCapture): boolean {
  return (capture as Partial<CaptureHandle>)[captureStateKey]?.overflow !== true;
}

// Takes back the `Idempotency-Expires` a held response announced (see transactionOf).
export function withdrawExpiry(capture: ResponseCapture) {
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
