import type { Attempt } from './attempt.js';
import type { FetchFunction } from './fetch-function.js';
import type { KeyFormat } from './idempotency-key.js';
import type { ParseMode } from './response-body.js';
import type { RetryOptions } from './retry-options.js';

/**
 * Headers as `new Headers(...)` takes them: a `Headers`, a record, or name-value pairs. Spelled out
 * from `Headers` because only the DOM library names it `HeadersInit`, and a Node project has none.
 *
 * @example
 * const headers: HeaderValues = { 'x-tenant': 'acme' };
 */
export type HeaderValues = ConstructorParameters<typeof Headers>[0];

/**
 * What {@link ClientOptions.getToken} is told. `refresh` is true once per call at most: the server
 * refused the token it gave (401 with `WWW-Authenticate: Bearer error="invalid_token"`), so a cached
 * token must not be given again.
 *
 * @example
 * createClient({ baseUrl, getToken: ({ refresh }) => (refresh ? auth.refresh() : auth.accessToken()) });
 */
export interface TokenContext {
  readonly refresh: boolean;
}

/**
 * Options of {@link createClient}.
 *
 * @example
 * const client = createClient({
 *   baseUrl: 'https://api.example.com/v1',
 *   getToken: () => auth.accessToken(),
 *   retry: { maxAttempts: 5, deadline: '60s' },
 * });
 */
export interface ClientOptions {
  /** Absolute http(s) URL every path is relative to, e.g. `https://api.example.com/v1`; no query, fragment or credentials. */
  baseUrl: string | URL;
  /** Default `globalThis.fetch`. */
  fetch?: FetchFunction | undefined;
  /**
   * Called before every attempt; a non-empty result is sent as `Authorization: Bearer <token>`, and
   * anything but a string, `null` or `undefined` ends the request with `token_failed`. Not called for a
   * request that gives its own `Authorization` header: that one is sent.
   * Per attempt, not per operation, so a token refreshed during the backoff is the one a retry uses.
   * A 401 with `WWW-Authenticate: Bearer error="invalid_token"` to a token it gave is sent again at
   * once with one it gives when asked `{ refresh: true }`, once per call, and only if that one differs;
   * not when its problem says `"retryable": true` and a repeat is harmless (the server could not check
   * the token, as idem's guard says of `keys_unavailable`): that one is retried with backoff instead.
   * Nor when its problem's `code` is `certificate_missing` (idem's guard: a token bound to a client
   * certificate came without one), as a new token does not bring the certificate: that one is final.
   */
  getToken?: ((context: TokenContext) => string | null | undefined | Promise<string | null | undefined>) | undefined;
  /** Headers sent with every request. */
  headers?: HeaderValues;
  /** How requests are retried; each request can override it. */
  retry?: RetryOptions | undefined;
  /** How client-made keys are written in the header. Default `'sf-string'`. */
  keyFormat?: KeyFormat | undefined;
  /** Uniform in `[0, 1)`, for the backoff jitter. Default `Math.random`; inject a seeded one in tests. */
  random?: (() => number) | undefined;
  /** Waits between attempts; must reject when `signal` aborts. Inject one that records waits in tests. */
  sleep?: ((ms: number, signal?: AbortSignal) => Promise<void>) | undefined;
  /**
   * The clock (epoch ms) for deadlines, attempt times and HTTP-date `Retry-After`. Default: `Date.now`
   * for attempt times and `Retry-After`, a monotonic clock for the deadline and durations (a stepped
   * wall clock moves neither); an injected one does all. The per-attempt timeout itself runs on a
   * real timer: it cuts off a real connection.
   */
  now?: (() => number) | undefined;
  /**
   * The longest response body read, in bytes (default 16 MiB; `Infinity` for no limit). A longer
   * one ends the request with `response_too_large` instead of filling memory; it is not retried, as
   * the same request gets the same answer. Not applied with `parse: 'none'`: that body is yours.
   */
  maxResponseBytes?: number | undefined;
  /**
   * Called before each wait for a retry, e.g. to show "retrying in 4 s" or to log. What it throws, or
   * the promise it returns rejects with, is ignored: an observer never changes the outcome of a request.
   */
  onRetry?: ((event: RetryEvent) => void) | undefined;
}

/**
 * What {@link ClientOptions.onRetry} is told before each wait.
 *
 * @example
 * createClient({ baseUrl, onRetry: ({ attempt, waitMs }) => log.info({ status: attempt.status, waitMs }, 'retrying') });
 */
export interface RetryEvent {
  method: string;
  url: string;
  /** The attempt that failed. */
  attempt: Attempt;
  /** How long the client waits before the next attempt, in milliseconds. */
  waitMs: number;
  /** The key the next attempt carries (decoded), if any. */
  key: string | undefined;
}

/**
 * Values of a query string: repeated for arrays, left out when `undefined`.
 *
 * @example
 * await client.get('/stock', { query: { item: 'sku-1', tag: ['a', 'b'], page: undefined } }); // ?item=sku-1&tag=a&tag=b
 */
export type QueryValue = string | number | boolean | readonly (string | number | boolean)[] | undefined;

/**
 * Options of one request.
 *
 * @example
 * await client.post('/charges', { amount: 500 }, { idempotencyKey: order.chargeKey, signal });
 */
export interface RequestOptions {
  /**
   * The operation's key. By default POST and PATCH get a fresh UUIDv4, made once and sent on every
   * attempt; other methods get none. Pass your own to retry one logical operation across calls (or
   * restarts), or `false` to send none and rely on a key the server mints.
   */
  idempotencyKey?: string | false | undefined;
  headers?: HeaderValues;
  query?: URLSearchParams | Record<string, QueryValue> | undefined;
  signal?: AbortSignal | undefined;
  /** Overrides the client's retry options for this request. */
  retry?: RetryOptions | undefined;
  /** How the response body is read. Default `'auto'`. */
  parse?: ParseMode | undefined;
  /** Overrides the client's {@link ClientOptions.maxResponseBytes} for this request. */
  maxResponseBytes?: number | undefined;
}

/**
 * Options of {@link Client.request}: {@link RequestOptions} plus a body.
 *
 * @example
 * await client.request('POST', '/charges', { body: { amount: 500 }, idempotencyKey: key });
 */
export interface RequestWithBodyOptions extends RequestOptions {
  body?: unknown;
}
