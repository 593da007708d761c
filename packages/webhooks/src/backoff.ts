import { type Duration, toMilliseconds } from '@idem/core';

/** Options of {@link createBackoff}. */
export interface BackoffOptions {
  /** The ceiling of the first wait. Default `'1s'` (spec part 8: waits of 1 s, 2 s, 4 s, randomized). */
  base?: Duration | undefined;
  /** No wait is ever longer than this. Default `'1h'`. */
  cap?: Duration | undefined;
  /** Growth per retry. Default 2. */
  factor?: number | undefined;
}

/** A full-jitter exponential backoff. */
export interface Backoff {
  /**
   * The largest wait before retry `retry` (1 = after the first failed attempt):
   * `min(cap, base * factor^(retry - 1))`.
   */
  ceiling(retry: number): number;
  /**
   * A wait drawn uniformly from `[0, ceiling(retry))` with `random` (which returns values in [0, 1)).
   * Full jitter spreads a crowd of senders that failed together over the whole interval, so their
   * retries do not arrive together (a fixed schedule, or none, re-synchronises them).
   */
  delay(retry: number, random: () => number): number;
  readonly baseMs: number;
  readonly capMs: number;
}

/**
 * Creates a full-jitter exponential backoff ("about 1 s, 2 s, 4 s, randomized", growing to a cap).
 *
 * @example
 * const backoff = createBackoff({ base: '1s', cap: '1h' });
 * backoff.ceiling(3);               // 4000
 * backoff.delay(3, Math.random);    // somewhere in [0, 4000)
 */
export function createBackoff(options: BackoffOptions = {}): Backoff {
  const baseMs = toMilliseconds(options.base ?? '1s', 'base');
  const capMs = toMilliseconds(options.cap ?? '1h', 'cap');
  const factor = options.factor ?? 2;
  if (baseMs <= 0) throw new TypeError('base must be positive');
  if (capMs < baseMs) throw new TypeError('cap must be at least base');
  if (!Number.isFinite(factor) || factor < 1) throw new TypeError('factor must be a finite number of at least 1');
  const ceiling = (retry: number) => {
    if (!Number.isInteger(retry) || retry < 1) throw new TypeError('retry must be a positive integer');
    // Past the cap the power is irrelevant; stopping early keeps it from overflowing to Infinity.
    const grown = baseMs * factor ** Math.min(retry - 1, 1024);
    return Math.min(capMs, grown);
  };
  return {
    baseMs,
    capMs,
    ceiling,
    delay(retry, random) {
      const r = random();
      if (!(r >= 0 && r < 1)) throw new RangeError('random() must return a number in [0, 1)');
      return Math.floor(r * ceiling(retry));
    },
  };
}

/**
 * A seeded pseudo-random source in [0, 1) (mulberry32), for reproducible schedules in tests and
 * simulations. Not for secrets.
 *
 * @example
 * const sender = createSender({ secret, random: seededRandom(42) });
 */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
