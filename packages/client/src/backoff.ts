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
  // A misbehaving injected source must not push a wait outside its bounds.
  const r = Math.min(1, Math.max(0, Number(schedule.random()) || 0));
  if (schedule.jitter === 'equal') return Math.round(ceiling / 2 + (r * ceiling) / 2);
  return Math.round(r * ceiling);
}
