import type { ClientOptions } from './client-options.js';
import type { FetchFunction } from './fetch-function.js';
import type { KeyFormat } from './idempotency-key.js';
import { followingRedirects } from './redirects.js';
import { normalizeBaseUrl } from './request-url.js';
import { type ResolvedRetry, resolveRetry } from './retry-options.js';
import { abortableSleep } from './sleep.js';

/** 16 MiB: far above any API answer, far below what runs a server or a browser tab out of memory. */
const defaultMaxResponseBytes = 16 * 2 ** 20;

/**
 * {@link ClientOptions} checked, with their defaults filled in: what a client runs on.
 *
 * @example
 * const { baseUrl, clientRetry } = clientSettings({ baseUrl: 'https://api.example.com' });
 */
export interface ClientSettings {
  /** The normalized base URL, without a trailing slash. */
  baseUrl: string;
  /** The fetch writes go through. */
  fetchFn: FetchFunction;
  /** The fetch reads go through: it follows redirects, keeping the client-wide headers on their origin. */
  readFetch: FetchFunction;
  keyFormat: KeyFormat;
  defaultHeaders: Headers;
  clientRetry: ResolvedRetry;
  random: () => number;
  sleep: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** The clock of attempt times and HTTP-date `Retry-After`. */
  now: () => number;
  /** The clock of the deadline and of attempt durations. */
  elapsed: () => number;
  getToken: ClientOptions['getToken'];
  onRetry: ClientOptions['onRetry'];
  clientMaxBytes: number;
}

/**
 * Checks the options of `createClient`, in the order a caller meets their errors, and fills in
 * the defaults. Throws a `TypeError` for the first option that is wrong.
 *
 * @example
 * const settings = clientSettings({ baseUrl: 'https://api.example.com', keyFormat: 'bare' });
 */
export function clientSettings(options: ClientOptions): ClientSettings {
  if (!options || typeof options !== 'object') throw new TypeError('createClient needs an options object');
  const baseUrl = normalizeBaseUrl(options.baseUrl);
  const fetchFn: FetchFunction =
    options.fetch ??
    // Called through globalThis: browsers refuse a fetch detached from its window ("Illegal invocation").
    ((input, init) => globalThis.fetch(input, init));
  if (typeof fetchFn !== 'function' || (options.fetch === undefined && typeof globalThis.fetch !== 'function')) {
    throw new TypeError('no fetch in this runtime: pass the fetch option');
  }
  if (options.getToken !== undefined && typeof options.getToken !== 'function') {
    throw new TypeError('getToken must be a function');
  }
  const keyFormat = options.keyFormat ?? 'sf-string';
  if (keyFormat !== 'sf-string' && keyFormat !== 'bare') throw new TypeError("keyFormat must be 'sf-string' or 'bare'");
  const defaultHeaders = new Headers(options.headers);
  // One key on every call would make every operation the client ever makes the same operation: the
  // second charge would be answered with the first one's stored response (spec 2.1: one key per
  // logical operation). Headers compare names case-insensitively, so every spelling is caught.
  if (defaultHeaders.has('idempotency-key')) {
    throw new TypeError(
      'headers must not hold an Idempotency-Key: it would be sent with every call, making them all one operation. ' +
        'Pass a key per call instead: client.post(path, body, { idempotencyKey })',
    );
  }
  // Reads follow redirects by hand, so that the client-wide headers (an API key, most often) stay
  // on the origins they were meant for.
  const clientHeaderNames: string[] = [];
  defaultHeaders.forEach((_value, name) => {
    clientHeaderNames.push(name);
  });
  const readFetch = followingRedirects(fetchFn, clientHeaderNames);
  const clientRetry = resolveRetry(options.retry);
  const random = options.random ?? Math.random;
  const sleep = options.sleep ?? abortableSleep;
  const now = options.now ?? Date.now;
  // The deadline and attempt durations on a monotonic clock: a wall clock stepped forward (NTP, a
  // resumed laptop) would end every operation in flight at once, one stepped back let it run past
  // its deadline. An injected `now` drives both.
  const elapsed = options.now ?? (() => performance.now());
  const getToken = options.getToken;
  const onRetry = options.onRetry;
  if (onRetry !== undefined && typeof onRetry !== 'function') throw new TypeError('onRetry must be a function');
  const clientMaxBytes = checkMaxBytes(options.maxResponseBytes ?? defaultMaxResponseBytes);
  for (const [name, value] of [
    ['random', random],
    ['sleep', sleep],
    ['now', now],
  ] as const) {
    if (typeof value !== 'function') throw new TypeError(`${name} must be a function`);
  }
  return {
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
  };
}

/**
 * Checks a `maxResponseBytes` setting: a positive whole number of bytes, or `Infinity`.
 *
 * @example
 * checkMaxBytes(1024); // 1024
 */
export function checkMaxBytes(value: number): number {
  if (value !== Number.POSITIVE_INFINITY && !(Number.isSafeInteger(value) && value > 0)) {
    throw new TypeError('maxResponseBytes must be a positive whole number of bytes, or Infinity');
  }
  return value;
}
