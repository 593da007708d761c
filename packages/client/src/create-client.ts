import type { Attempt, AttemptOutcome } from './attempt.js';
import { awaitToken, type TokenRun } from './await-token.js';
import { retryWait } from './backoff.js';
import type { ClientOptions, RequestOptions, RequestWithBodyOptions } from './client-options.js';
import { checkMaxBytes, clientSettings } from './client-settings.js';
import { drainBody, drainCapBytes } from './drain-body.js';
import { type RequestFailedCode, RequestFailedError } from './errors.js';
import { notify } from './notify.js';
import { chooseKey, mintedKey } from './operation-key.js';
import { unfollowedRedirect } from './redirects.js';
import { encodeBody } from './request-body.js';
import { requestUrl } from './request-url.js';
import { BodyParseError, decodeBody, type ParseMode } from './response-body.js';
import { retryAfterOf } from './retry-after.js';
import {
  isCertificateError,
  isHandshakeRefused,
  isIdempotentMethod,
  isNotConnected,
  isProtocolMismatch,
  isRetryableStatus,
  isSafeToRepeat,
  normalizeMethod,
  problemOf,
  saysBodyIncomplete,
  saysCertificateMissing,
  saysNotRetryable,
  saysRefusedForNow,
  saysTokenInvalid,
} from './retry-decision.js';
import { type ResolvedRetry, type RetryOptions, resolveRetry, retryHorizonMs } from './retry-options.js';
import { runAttempt } from './run-attempt.js';

/**
 * A successful outcome (status below 400) of one logical operation.
 *
 * @example
 * const charge = await client.post<{ id: string }>('/charges', { amount: 500 });
 * charge.body.id; charge.replayed; charge.key; charge.attempts.length;
 */
export interface ClientResult<T = unknown> {
  readonly status: number;
  readonly headers: Headers;
  /** The parsed body (see {@link ParseMode}). */
  readonly body: T;
  /** The last response; its body has been read unless `parse: 'none'`. */
  readonly response: Response;
  /** True when the server answered with a stored outcome (`Idempotent-Replayed: true`): nothing ran again. */
  readonly replayed: boolean;
  /** The key the operation used (decoded), a server-minted one if the server sent one; else `undefined`. */
  readonly key: string | undefined;
  readonly attempts: readonly Attempt[];
}

/**
 * A fetch client whose writes are safe to retry. Create one with {@link createClient}.
 *
 * @example
 * const { body } = await client.get<Stock>('/stock', { query: { item: 'sku-1' } });
 */
export interface Client {
  get<T = unknown>(path: string, options?: RequestOptions): Promise<ClientResult<T>>;
  delete<T = unknown>(path: string, options?: RequestOptions): Promise<ClientResult<T>>;
  post<T = unknown>(path: string, body?: unknown, options?: RequestOptions): Promise<ClientResult<T>>;
  put<T = unknown>(path: string, body?: unknown, options?: RequestOptions): Promise<ClientResult<T>>;
  patch<T = unknown>(path: string, body?: unknown, options?: RequestOptions): Promise<ClientResult<T>>;
  /** Any method; POST, PATCH and other non-idempotent methods get a key like `post` does. */
  request<T = unknown>(method: string, path: string, options?: RequestWithBodyOptions): Promise<ClientResult<T>>;
  /**
   * The longest time, in milliseconds, after an operation's first attempt at which one of its retries
   * can still start, for these retry options (or the client's). A server's retention must be longer,
   * or a late retry executes again (spec part 8). `Infinity` when nothing bounds it.
   */
  retryHorizon(retry?: RetryOptions): number;
  /** The normalized base URL, without a trailing slash. */
  readonly baseUrl: string;
}

type AttemptRecord = { -readonly [K in keyof Attempt]: Attempt[K] };

const methodToken = /^[!#$%&'*+.^`|~\w-]+$/;
const parseModes: readonly ParseMode[] = ['auto', 'json', 'text', 'bytes', 'none'];

const isReplay = (response: Response) => response.headers.get('idempotent-replayed')?.trim().toLowerCase() === 'true';

/**
 * Creates a client on the standard `fetch` that gets the client half of idempotency right by default:
 * one key per logical operation, reused on every attempt; retries only where a repeat is safe;
 * exponential backoff with full jitter; `Retry-After`, a total deadline and `AbortSignal` honoured;
 * server-minted keys adopted. No runtime dependencies; runs in Node and browsers.
 *
 * @example
 * const client = createClient({ baseUrl: 'https://api.example.com', getToken: () => session.token });
 * const charge = await client.post<{ id: string }>('/charges', { amount: 500 });
 * console.log(charge.body.id, charge.replayed ? 'replayed' : 'executed', charge.key);
 */
export function createClient(options: ClientOptions): Client {
  const {
    baseUrl,
    fetchFn,
    readFetch,
    keyFormat,
    defaultHeaders,
    clientRetry,
    random,
    sleep,
    now,
    elapsed,
    getToken,
    onRetry,
    clientMaxBytes,
  } = clientSettings(options);

  const send = async <T>(
    method: string,
    path: string,
    body: unknown,
    request: RequestOptions = {},
  ): Promise<ClientResult<T>> => {
    if (typeof method !== 'string' || !methodToken.test(method))
      throw new TypeError('method must be an HTTP method name');
    const verb = normalizeMethod(method);
    // fetch refuses these, in any case, on every attempt, which would look like a network error and be retried.
    const upper = verb.toUpperCase();
    if (upper === 'CONNECT' || upper === 'TRACE' || upper === 'TRACK') {
      throw new TypeError(`fetch cannot send a ${upper} request`);
    }
    const retry: ResolvedRetry = request.retry === undefined ? clientRetry : resolveRetry(request.retry, clientRetry);
    const parse = request.parse ?? 'auto';
    if (!parseModes.includes(parse)) throw new TypeError("parse must be 'auto', 'json', 'text', 'bytes' or 'none'");
    const maxBytes = request.maxResponseBytes === undefined ? clientMaxBytes : checkMaxBytes(request.maxResponseBytes);
    const url = requestUrl(baseUrl, path, request.query);
    // fetch refuses these with a TypeError on every attempt, which would look like a network error
    // and be retried until attempts_exhausted.
    if ((verb === 'GET' || verb === 'HEAD') && body !== undefined) {
      throw new TypeError(`a ${verb} request cannot have a body: send it with POST, PUT or PATCH, or put it in query`);
    }
    const callerSignal = request.signal;

    // Everything this call sends is read from the caller's values here, synchronously, before the
    // first await: the caller may change or reuse them as soon as the call returns its promise.
    const baseHeaders = new Headers(defaultHeaders);
    const ownHeaders = new Headers(request.headers);
    ownHeaders.forEach((value, name) => {
      baseHeaders.set(name, value);
    });
    // A request's own headers win, Authorization too (Basic credentials on a token exchange, a call
    // made for another user): getToken is then not called for it, rather than its token replacing them.
    const tokenFor = ownHeaders.has('authorization') ? undefined : getToken;

    // The key belongs to the logical operation: chosen here, once, before the first attempt. Making
    // a new one per attempt would turn every retry into a new operation (spec 2.1: "a new key per
    // retry is wrong").
    const chosen = chooseKey(request.idempotencyKey, baseHeaders, verb, keyFormat);
    let key = chosen.key;
    let keyField = chosen.field;
    const callerKeyed = chosen.callerKeyed;

    // Before the first await of the call: encodeBody takes the body synchronously (see there), so
    // every attempt sends the bytes the caller passed, whatever it does afterwards with its buffer,
    // URLSearchParams or FormData while this call backs off.
    const encoded = encodeBody(body);
    if (encoded.contentType !== undefined && !baseHeaders.has('content-type')) {
      baseHeaders.set('content-type', encoded.contentType);
    }

    const attempts: AttemptRecord[] = [];
    const deadlineAt = elapsed() + retry.deadlineMs;
    // The token the last attempt carried from getToken, and one asked for afresh after the server
    // refused it (401 invalid_token): at most one refresh per call, so a server that refuses every
    // token costs one more request, not a loop.
    let sentToken: string | undefined;
    let refreshedToken: string | undefined;
    let refreshed = false;
    let lastResponse: Response | undefined;
    let lastBody: unknown;

    const fail = (code: RequestFailedCode, cause?: unknown): RequestFailedError =>
      new RequestFailedError(code, {
        response: lastResponse,
        body: lastBody,
        key,
        attempts: Object.freeze(attempts.map((a) => Object.freeze({ ...a }))),
        cause,
      });

    // Asks getToken for the token of the next attempt; how it fails ends the call.
    const tokenOf = async (refresh: boolean): Promise<string | null | undefined> => {
      if (tokenFor === undefined) return undefined;
      let fetched: TokenRun;
      try {
        fetched = await awaitToken(tokenFor, callerSignal, deadlineAt - elapsed(), refresh);
      } catch (error) {
        // Wrapped, not passed through: the caller needs the key, since an earlier attempt may have run.
        throw fail('token_failed', error);
      }
      if (fetched.kind === 'aborted') throw fail('aborted', fetched.reason);
      if (fetched.kind === 'deadline') throw fail('deadline_exceeded');
      const { token } = fetched;
      // Anything else (an object a token endpoint returned, passed on unread) would send the request
      // without Authorization, and the caller would see only a 401: getToken failed.
      if (typeof token !== 'string' && token !== null && token !== undefined) {
        throw fail('token_failed', new TypeError('getToken must give a string, null or undefined'));
      }
      return token;
    };

    if (callerSignal?.aborted) throw fail('aborted', callerSignal.reason);

    for (let number = 1; ; number++) {
      const headers = new Headers(baseHeaders);
      if (keyField !== undefined) headers.set('idempotency-key', keyField);
      if (tokenFor) {
        // A token refresh that hangs (an identity provider that does not answer) must not outlive
        // the caller's signal or the deadline: both end the operation while it is pending.
        // The refreshed token was asked for when the 401 came: this attempt carries it.
        const token = refreshedToken ?? (await tokenOf(false));
        refreshedToken = undefined;
        sentToken = typeof token === 'string' && token.length > 0 ? token : undefined;
        if (typeof token === 'string' && token.length > 0) {
          try {
            headers.set('authorization', `Bearer ${token}`);
          } catch (error) {
            // A token with a line break inside, or a character above U+00FF, is no header value:
            // Headers throws a TypeError. That is getToken failing, after an earlier attempt may
            // have run, so the caller gets the key with it, as for a getToken that throws.
            throw fail('token_failed', error);
          }
        }
      }
      if (callerSignal?.aborted) throw fail('aborted', callerSignal.reason);

      const attemptStart = now();
      const attemptBegun = elapsed();
      const remaining = deadlineAt - attemptBegun;
      if (remaining <= 0) throw fail('deadline_exceeded');
      const cutByDeadline = remaining < retry.timeoutMs;
      // A write is not sent on to wherever a redirect points: fetch would take its key (and, on a 307
      // or 308, its body) to another URL, turn it into a GET on a 303 and report that GET's answer,
      // losing the redirect's own Idempotent-Replayed and minted key, and repeat a redirect loop as
      // a network error. Its 3xx is its answer. Reads follow redirects as fetch does, but keep the
      // client's own headers off other origins (followingRedirects).
      const writes = keyField !== undefined || !isIdempotentMethod(verb);
      const run = await runAttempt(
        writes ? fetchFn : readFetch,
        url,
        { method: verb, headers, body: encoded.body, redirect: 'manual' },
        Math.min(retry.timeoutMs, remaining),
        callerSignal,
        parse === 'none' ? undefined : maxBytes,
      );
      const attempt: AttemptRecord = {
        number,
        key,
        startedAt: attemptStart,
        durationMs: elapsed() - attemptBegun,
        outcome: (run.kind === 'aborted'
          ? 'network-error'
          : run.kind === 'too-large'
            ? 'response'
            : run.kind) as AttemptOutcome,
        status: undefined,
        replayed: false,
        retryAfterMs: undefined,
        waitMs: undefined,
        error: run.kind === 'network-error' || run.kind === 'timeout' ? run.error : undefined,
      };
      attempts.push(attempt);
      // The headers arrived, even when the body then failed: what they say is known.
      if (run.response !== undefined) {
        const { response } = run;
        attempt.status = response.status;
        attempt.replayed = isReplay(response);
        attempt.retryAfterMs = retryAfterOf(response.headers, now());
        const minted = mintedKey(response.headers, verb, callerKeyed, key);
        if (minted !== undefined) {
          key = minted.key;
          keyField = minted.field;
        }
        lastResponse = response;
        lastBody = undefined;
      }
      if (run.kind === 'aborted') {
        attempt.error = run.reason;
        throw fail('aborted', run.reason);
      }
      if (run.kind === 'too-large') throw fail('response_too_large');

      let retryable: boolean;
      if (run.kind === 'response') {
        const { response } = run;
        // What a browser gives a script for a redirect it may not read: status 0, no headers.
        if (response.type === 'opaqueredirect') throw fail('redirect_unreadable');
        // A read's redirect that could not be followed (a loop, a Location that is no http(s) URL) is
        // the answer every attempt gets: final, and a failure, as the resource was not reached.
        const unfollowed = unfollowedRedirect(response);
        // A replay is the stored outcome itself: asking again returns the same thing.
        retryable =
          unfollowed === undefined &&
          !attempt.replayed &&
          isRetryableStatus(response.status, { method: verb, keyed: keyField !== undefined });
        if (run.bytes !== undefined) {
          try {
            lastBody = decodeBody(run.bytes, response.headers.get('content-type'), parse === 'none' ? 'bytes' : parse);
          } catch (error) {
            if (!(error instanceof BodyParseError)) throw error;
            // An error page that claims JSON and is not: keep its text for the error.
            lastBody = new TextDecoder().decode(run.bytes);
            if (!retryable && response.status < 400 && unfollowed === undefined) {
              throw fail('invalid_response_body', error);
            }
          }
        }
        const problem = problemOf(response.headers.get('content-type'), run.bytes);
        if (saysNotRetryable(problem)) retryable = false;
        // The server received less than was sent and ran nothing; a repeat is still only made where
        // one is harmless, in case what answered only claims to be idem.
        else if (
          !attempt.replayed &&
          response.status === 400 &&
          saysBodyIncomplete(problem) &&
          isSafeToRepeat({ method: verb, keyed: keyField !== undefined })
        )
          retryable = true;
        // A 401 the server will lift by itself (@idem/guard's keys_unavailable, a DPoP replay memory
        // full or down): retried with backoff, with the same token, where a repeat is harmless. The
        // token was not found wanting, so none is asked for afresh (keys_unavailable comes with an
        // invalid_token challenge) and the one refresh of the call stays for a 401 that is about it.
        const refusedForNow =
          !attempt.replayed &&
          saysRefusedForNow(response.status, problem) &&
          isSafeToRepeat({ method: verb, keyed: keyField !== undefined });
        if (refusedForNow) retryable = true;
        // RFC 6750 3.1: the token expired or was revoked, and the server refused the request before
        // running it (whatever the method: it was not let in). A token asked for afresh may pass:
        // sent again at once, once per call, and only with a token other than the one refused (a
        // getToken that ignores `refresh` gives its cached one back, and the same 401 would follow).
        // Not for a token bound to a client certificate the request lacks: a fresh one lacks it too.
        if (
          !refusedForNow &&
          !saysCertificateMissing(problem) &&
          response.status === 401 &&
          sentToken !== undefined &&
          !refreshed &&
          !attempt.replayed &&
          number < retry.maxAttempts &&
          saysTokenInvalid(response.headers.get('www-authenticate'))
        ) {
          refreshed = true;
          const fresh = await tokenOf(true);
          if (typeof fresh === 'string' && fresh.length > 0 && fresh !== sentToken) {
            refreshedToken = fresh;
            retryable = true;
          } else retryable = false;
        }
        if (unfollowed !== undefined) throw fail('http_error', unfollowed);
        if (!retryable) {
          if (response.status < 400) {
            return {
              status: response.status,
              headers: response.headers,
              body: lastBody as T,
              response,
              replayed: attempt.replayed,
              key,
              attempts: Object.freeze(attempts.map((a) => Object.freeze({ ...a }))),
            };
          }
          throw fail('http_error');
        }
      } else {
        // A certificate the runtime refused, or a handshake that failed over the protocol (no TLS
        // version in common): nothing was sent, and every retry meets it again.
        if (run.kind === 'network-error' && (isCertificateError(run.error) || isProtocolMismatch(run.error)))
          throw fail('tls_failed', run.error);
        // The server refused the client's certificate in the handshake: it processed nothing, and the
        // next attempt presents the same certificate. Not `network_error`: that says it may have run.
        if (run.kind === 'network-error' && isHandshakeRefused(run.error)) throw fail('tls_refused', run.error);
        // The outcome is unknown: the server may have run the request. Only a key or an idempotent
        // method makes a repeat harmless, unless the connection was never made: nothing was sent.
        retryable =
          isSafeToRepeat({ method: verb, keyed: keyField !== undefined }) ||
          (run.kind === 'network-error' && isNotConnected(run.error));
        // Before the deadline's own code: an unkeyed write cut short by the deadline may have run and
        // has no key to retry it with, which is what `timeout` tells (`deadline_exceeded` says
        // "retry later with error.key").
        if (!retryable) throw fail(run.kind === 'timeout' ? 'timeout' : 'network_error', run.error);
        if (run.kind === 'timeout' && cutByDeadline) throw fail('deadline_exceeded', run.error);
      }

      const cause = run.kind === 'response' ? undefined : run.error;
      if (number >= retry.maxAttempts) throw fail('attempts_exhausted', cause);
      // A refreshed token is no reason to wait: the server refused the old one, not the load.
      const refreshing = refreshedToken !== undefined;
      if (!refreshing && attempt.retryAfterMs !== undefined && attempt.retryAfterMs > retry.maxRetryAfterMs) {
        throw fail('retry_after_too_long', cause);
      }
      // Retry-After is a floor ("not before"), and the backoff keeps growing under it, so a key that
      // stays in progress is asked about less and less often; above it, a little jitter (retryWait).
      const wait = refreshing ? 0 : retryWait(number, { ...retry, random }, attempt.retryAfterMs);
      if (elapsed() + wait >= deadlineAt) throw fail('deadline_exceeded', cause);
      attempt.waitMs = wait;
      // Observers never change the outcome, whether they throw or reject.
      if (onRetry) notify(onRetry, { method: verb, url, attempt: Object.freeze({ ...attempt }), waitMs: wait, key });
      // parse: 'none' left the body unread. A small one is read to its end during the wait, so its
      // connection is reused (a cancelled body costs the connection whenever it has not fully
      // arrived); a large one is given up at once. The drain ends within what is left of the
      // attempt's timeout (its headers took the rest), and the deadline, or, with neither, with the
      // wait: a body that stalls must not hold the retry, nor stretch the retry horizon.
      const drainMs = Math.min(retry.timeoutMs - attempt.durationMs, deadlineAt - elapsed());
      const drain =
        run.kind === 'response' && run.bytes === undefined
          ? drainBody(run.response, drainCapBytes, drainMs)
          : undefined;
      try {
        await sleep(wait, callerSignal);
      } catch (error) {
        drain?.cancel();
        if (callerSignal?.aborted) throw fail('aborted', callerSignal.reason);
        throw error;
      }
      if (drain !== undefined) {
        if (!Number.isFinite(drainMs)) drain.cancel();
        await drain.done;
      }
      if (callerSignal?.aborted) throw fail('aborted', callerSignal.reason);
    }
  };

  return {
    get: (path, request) => send('GET', path, undefined, request),
    delete: (path, request) => send('DELETE', path, undefined, request),
    post: (path, body, request) => send('POST', path, body, request),
    put: (path, body, request) => send('PUT', path, body, request),
    patch: (path, body, request) => send('PATCH', path, body, request),
    request: (method, path, request = {}) => send(method, path, request.body, request),
    retryHorizon: (retry) => retryHorizonMs(retry === undefined ? clientRetry : resolveRetry(retry, clientRetry)),
    baseUrl,
  };
}
