/**
 * A clock that runs `offsetMs` ahead of (or, negative, behind) a base clock: what a server whose
 * wall clock has drifted sees. The offset can be changed while it runs, to model a clock that jumps
 * (an NTP step) in the middle of a request.
 *
 * @example
 * const now: SkewedClock = skewedClock(-30_000);
 * now(); // Date.now() - 30_000
 * now.offsetMs += 5_000; // an NTP step forward
 */
export interface SkewedClock {
  /** The skewed time, in epoch milliseconds. */
  (): number;
  /** The current offset from the base clock, in milliseconds. */
  offsetMs: number;
}

/**
 * Makes a {@link SkewedClock} for the `now` option of `createIdempotency()`: give each worker of a
 * fault test its own skew and check that leases and retention still hold, because stores time them
 * with their own clocks and never with the application's.
 *
 * @example
 * import { createIdempotency } from '@idem/core';
 * import { skewedClock } from '@idem/testkit';
 *
 * const now = skewedClock(30_000); // this worker's clock is 30 s fast
 * const engine = createIdempotency({ store, now });
 * now.offsetMs = -30_000; // and now 30 s slow
 */
export function skewedClock(offsetMs: number, base: () => number = Date.now): SkewedClock {
  if (!Number.isFinite(offsetMs)) throw new TypeError('offsetMs must be a finite number of milliseconds');
  const clock = (() => base() + clock.offsetMs) as SkewedClock;
  clock.offsetMs = offsetMs;
  return clock;
}
