import type { IncomingMessage } from 'node:http';
import { negotiatedBody } from './content-coding.js';
import { engineFrom } from './engine.js';
import { type SettleNow, settleNow } from './engine-hooks.js';
import type { IdempotencyEngine, Lease } from './engine-types.js';
import { IdempotencyError, isTransactionAbortedError } from './errors.js';
import type { IdempotencyEvent, RefusalCode } from './events.js';
import { ExecutionContext } from './execution-context.js';
import { checkExcludes, fingerprintRequest, type RequestParts } from './fingerprint.js';
import { incompleteBody, tooLarge } from './http-body.js';
import {
  type CaptureHandle,
  captureResponse,
  captureStateKey,
  keptWhole,
  type ReplayedHeaders,
  withdrawExpiry,
} from './http-capture.js';
import {
  checkIdentityHeaders,
  checkPrevious,
  defaultReplayHeaders,
  expiresHeader,
  type HttpIdempotencyOptions,
  headerName,
  identityOf,
  knownFingerprintOptions,
  knownHttpOptions,
  MIB,
  methodToken,
  neverReplayed,
  positiveInteger,
  previousFingerprints,
} from './http-options.js';
import { problemResponse } from './http-problem.js';
import type {
  CaptureOptions,
  CaptureResult,
  HttpBeginResult,
  HttpIdempotency,
  HttpRequestInfo,
  HttpResponse,
  ResponseCapture,
  RouteOverrides,
} from './http-types.js';
import { parseIdempotencyKey } from './key.js';
import { answeredForHandler, endedMark, hadNoEffect, hasEnded, mark, noEffectMark, watchedBy } from './lease-marks.js';
import { mintKey } from './mint.js';
import { notify } from './notify.js';
import { assertKnownOptions } from './option-names.js';
import { type Awaitable, isPending, type StoredResponse } from './store.js';
import { checkStoreUnavailable } from './store-unavailable.js';
import { sizeOverLimit } from './stored-response.js';

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
  const storeUnavailable = checkStoreUnavailable(options.storeUnavailable);
  if (transactional && storeUnavailable === 'fail-open') {
    throw new TypeError(
      "storeUnavailable: 'fail-open' cannot be used with transactional: true: the handler's writes commit in the store's transaction, which cannot begin without the store",
    );
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
      storeUnavailable,
    });
    if (started.kind === 'reject') return { kind: 'respond', response: problem(started.error) };
    // Fail-open: the request goes on as one no idempotency covers. A minted key is not handed out:
    // nothing stored it, so a retry with it would run again as if it were protected.
    if (started.kind === 'unprotected')
      return minted ? { kind: 'pass', unprotected: true } : { kind: 'pass', echo, unprotected: true };
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

// The errors `refuse` reports: those that answer a request before its record is looked up.
const refusalCodes: ReadonlySet<string> = new Set<RefusalCode>([
  'key_missing',
  'key_invalid',
  'scope_missing',
  'body_too_large',
  'body_incomplete',
]);

function pick(headers: Record<string, string>, allow: ReadonlySet<string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name in headers) if (allow.has(name)) out[name] = headers[name] as string;
  return out;
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
