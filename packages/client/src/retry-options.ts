import { backoffCeiling, type Jitter, retryAfterSpread } from './backoff.js';
import { type Duration, durationToMs } from './duration.js';

/**
 * How the client retries. Every field is optional; the defaults follow spec part 8 (waits of about
 * 1 s, 2 s, 4 s, randomized) and keep one operation's retries inside a minute, far inside the 24 h
 * retention servers keep keys for.
 *
 * @example
 * createClient({ baseUrl, retry: { maxAttempts: 8, maxDelay: '20s', deadline: '2m' } });
 */
export interface RetryOptions {
  /** Attempts in total, the first included. Default 5. `1` turns retries off. */
  maxAttempts?: number | undefined;
  /** Ceiling of the first retry's wait; each later ceiling doubles. Default `'1s'`; must be above zero. */
  baseDelay?: Duration | undefined;
  /** No wait's ceiling grows beyond this. Default `'30s'`; must be at least `baseDelay`. */
  maxDelay?: Duration | undefined;
  /** How waits are randomized. Default `'full'`. */
  jitter?: Jitter | undefined;
  /** Longest one attempt may take, body included. Default `'10s'`; `false` for none. */
  timeout?: Duration | false | undefined;
  /** Longest the whole operation may take, retries and waits included. Default `'60s'`; `false` for none. */
  deadline?: Duration | false | undefined;
  /**
   * Longest `Retry-After` the client accepts. A server asking for more ends the operation with
   * `retry_after_too_long` instead of retrying early against its wish. Default `'60s'`.
   */
  maxRetryAfter?: Duration | undefined;
}

/**
 * {@link RetryOptions} with defaults applied, in milliseconds (`Infinity` for "none").
 *
 * @example
 * resolveRetry({ deadline: false }).deadlineMs; // Infinity
 */
export interface ResolvedRetry {
  readonly maxAttempts: number;
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
  readonly jitter: Jitter;
  readonly timeoutMs: number;
  readonly deadlineMs: number;
  readonly maxRetryAfterMs: number;
}

const jitters: readonly Jitter[] = ['full', 'equal', 'none'];

/**
 * Applies defaults and checks `options` (layered over `base`), throwing a `TypeError` that names
 * the bad field.
 *
 * @example
 * resolveRetry({ maxAttempts: 3 }).baseDelayMs; // 1000
 */
export function resolveRetry(options: RetryOptions | undefined, base?: ResolvedRetry): ResolvedRetry {
  if (options !== undefined && (options === null || typeof options !== 'object')) {
    throw new TypeError('retry must be an object');
  }
  const o = options ?? {};
  const maxAttempts = o.maxAttempts ?? base?.maxAttempts ?? 5;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1)
    throw new TypeError('retry.maxAttempts must be an integer of at least 1');
  const jitter = o.jitter ?? base?.jitter ?? 'full';
  if (!jitters.includes(jitter)) throw new TypeError("retry.jitter must be 'full', 'equal' or 'none'");
  const optional = (value: Duration | false | undefined, fallback: number, name: string) => {
    if (value === undefined) return fallback;
    if (value === false) return Number.POSITIVE_INFINITY;
    const ms = durationToMs(value, name);
    if (ms <= 0) throw new TypeError(`${name} must be above zero, or false for none`);
    return ms;
  };
  const baseDelayMs =
    o.baseDelay === undefined ? (base?.baseDelayMs ?? 1_000) : durationToMs(o.baseDelay, 'retry.baseDelay');
  // A zero base makes every backoff wait zero: retries in a tight loop against a server that is down.
  if (baseDelayMs <= 0) throw new TypeError('retry.baseDelay must be above zero');
  const maxDelayMs =
    o.maxDelay === undefined ? (base?.maxDelayMs ?? 30_000) : durationToMs(o.maxDelay, 'retry.maxDelay');
  // A cap below the first ceiling would silently replace the whole schedule with one fixed wait.
  if (maxDelayMs < baseDelayMs) throw new TypeError('retry.maxDelay must be at least retry.baseDelay');
  return Object.freeze({
    maxAttempts,
    baseDelayMs,
    maxDelayMs,
    jitter,
    timeoutMs: optional(o.timeout, base?.timeoutMs ?? 10_000, 'retry.timeout'),
    deadlineMs: optional(o.deadline, base?.deadlineMs ?? 60_000, 'retry.deadline'),
    maxRetryAfterMs:
      o.maxRetryAfter === undefined
        ? (base?.maxRetryAfterMs ?? 60_000)
        : durationToMs(o.maxRetryAfter, 'retry.maxRetryAfter'),
  });
}

/**
 * The longest time, in milliseconds, after the first attempt starts at which a retry of the same
 * operation can still start: the total deadline, or, if that is longer, every attempt timing out and
 * every wait at its longest (the backoff ceiling, or the largest accepted `Retry-After` and the
 * jitter a wait may add past it: see retryWait).
 * `Infinity` when neither a deadline nor a per-attempt timeout bounds it.
 *
 * A server's retention must outlive this, or a late retry executes again (spec part 8).
 *
 * @example
 * retryHorizonMs(resolveRetry({ maxAttempts: 3, timeout: '5s', deadline: false, maxRetryAfter: '2s' }));
 * // (5000 + 2000 + 400) + (5000 + 2000 + 400) = 14800: each wait up to Retry-After and its spread
 */
export function retryHorizonMs(retry: ResolvedRetry): number {
  let horizon = 0;
  for (let retryNumber = 1; retryNumber < retry.maxAttempts; retryNumber++) {
    const ceiling = backoffCeiling(retryNumber, retry.baseDelayMs, retry.maxDelayMs);
    // The longest accepted Retry-After, and the jitter a wait may add past it (retryWait).
    const spread = retry.jitter === 'none' ? 0 : retryAfterSpread(retry.maxRetryAfterMs, retry.baseDelayMs);
    const step = retry.timeoutMs + Math.max(ceiling, retry.maxRetryAfterMs + spread);
    if (ceiling >= retry.maxDelayMs) {
      // Every later retry adds this same step: multiplied, not looped, so a maxAttempts in the
      // millions (retries bounded by a deadline, or by nothing) does not hang a startup check.
      horizon += step * (retry.maxAttempts - retryNumber);
      break;
    }
    horizon += step;
    if (horizon >= retry.deadlineMs) return retry.deadlineMs;
  }
  return Math.min(horizon, retry.deadlineMs);
}
