/**
 * How a backoff wait is randomized:
 * - `'full'` (default): uniform in `[0, ceiling]`. Spreads a crowd of clients the most, so a server
 *   that just came back is not hit by all of them in the same second.
 * - `'equal'`: uniform in `[ceiling / 2, ceiling]`. Never waits less than half the ceiling.
 * - `'none'`: exactly the ceiling. For tests and single clients only.
 *
 * @example
 * const jitter: Jitter = 'full';
 */
export type Jitter = 'full' | 'equal' | 'none';

/**
 * What {@link backoffDelay} needs: the schedule and a source of randomness.
 *
 * @example
 * backoffDelay(1, { baseDelayMs: 1000, maxDelayMs: 30_000, jitter: 'full', random: Math.random });
 */
export interface BackoffSchedule {
  /** Ceiling of the first retry's wait, in milliseconds (spec part 8: about 1 s). */
  baseDelayMs: number;
  /** No ceiling grows beyond this, in milliseconds. */
  maxDelayMs: number;
  jitter: Jitter;
  /** Uniform in `[0, 1)`, like `Math.random`. Inject a seeded one for reproducible tests. */
  random: () => number;
}

/**
 * The most the wait before retry number `retry` (1 for the first retry) can be: `base * 2^(retry-1)`,
 * capped at `max`. With the defaults: 1 s, 2 s, 4 s, 8 s, ... up to 30 s (spec part 8).
 *
 * @example
 * backoffCeiling(3, 1000, 30_000); // 4000
 */
export function backoffCeiling(retry: number, baseDelayMs: number, maxDelayMs: number): number {
  // 2 ** retry overflows to Infinity for absurd retry numbers; Math.min then keeps the cap.
  return Math.min(maxDelayMs, baseDelayMs * 2 ** Math.max(0, retry - 1));
}

/**
 * The randomized wait, in whole milliseconds, before retry number `retry` (1-based). Always within
 * `[0, backoffCeiling(retry)]` (`'full'`), `[ceiling / 2, ceiling]` (`'equal'`) or the ceiling (`'none'`).
 *
 * @example
 * backoffDelay(2, { baseDelayMs: 1000, maxDelayMs: 30_000, jitter: 'full', random: Math.random }); // 0..2000
 */
export function backoffDelay(retry: number, schedule: BackoffSchedule): number {
  const ceiling = backoffCeiling(retry, schedule.baseDelayMs, schedule.maxDelayMs);
  if (schedule.jitter === 'none') return Math.round(ceiling);
  return Math.round(jittered(ceiling, schedule.jitter, draw(schedule)));
}

/**
 * The most a wait may run past a `Retry-After` of `retryAfterMs` (see {@link retryWait}): one
 * `baseDelay`, and at most a fifth of what the server asked for.
 *
 * @example
 * retryAfterSpread(5000, 1000); // 1000
 * retryAfterSpread(2000, 1000); // 400
 */
export function retryAfterSpread(retryAfterMs: number, baseDelayMs: number): number {
  // Whole milliseconds, as every wait is.
  return Math.min(baseDelayMs, Math.floor(retryAfterMs / 5));
}

/**
 * The wait, in whole milliseconds, before retry number `retry` (1-based) when the server may have
 * said when to come back (`retryAfterMs`, a "not before"). The jittered backoff when that is as long;
 * else `Retry-After` plus a jittered share of {@link retryAfterSpread}: without it, every client a
 * rate limiter turned away with one `Retry-After` came back in the same millisecond, and was turned
 * away again. One draw of `random` for both, as {@link backoffDelay} makes; none with `'none'`.
 *
 * @example
 * retryWait(1, { baseDelayMs: 1000, maxDelayMs: 30_000, jitter: 'full', random: () => 0.5 }, 5000); // 5500
 */
export function retryWait(retry: number, schedule: BackoffSchedule, retryAfterMs: number | undefined): number {
  const ceiling = backoffCeiling(retry, schedule.baseDelayMs, schedule.maxDelayMs);
  const r = schedule.jitter === 'none' ? 1 : draw(schedule);
  const backoff = Math.round(jittered(ceiling, schedule.jitter, r));
  if (retryAfterMs === undefined || backoff >= retryAfterMs) return backoff;
  if (schedule.jitter === 'none') return retryAfterMs;
  const spread = retryAfterSpread(retryAfterMs, schedule.baseDelayMs);
  return Math.round(retryAfterMs + jittered(spread, schedule.jitter, r));
}

// A misbehaving injected source must not push a wait outside its bounds.
function draw(schedule: BackoffSchedule): number {
  return Math.min(1, Math.max(0, Number(schedule.random()) || 0));
}

function jittered(ceiling: number, jitter: Jitter, r: number): number {
  if (jitter === 'none') return ceiling;
  if (jitter === 'equal') return ceiling / 2 + (r * ceiling) / 2;
  return r * ceiling;
}
