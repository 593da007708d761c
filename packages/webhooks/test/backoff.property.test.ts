import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createBackoff, seededRandom } from '../src/index.js';

describe('full-jitter backoff (case 27)', () => {
  const backoff = createBackoff({ base: '1s', cap: '60s' });

  it('keeps every draw inside [0, min(cap, base * 2^(n-1))) over 10,000 seeds', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 32 - 1 }), fc.integer({ min: 1, max: 40 }), (seed, retry) => {
        const random = seededRandom(seed);
        const ceiling = Math.min(60_000, 1000 * 2 ** (retry - 1));
        for (let i = 0; i < 5; i++) {
          const wait = backoff.delay(retry, random);
          if (wait < 0 || wait >= ceiling || wait > 60_000) return false;
        }
        return backoff.ceiling(retry) === ceiling;
      }),
      { numRuns: 10_000 },
    );
  });

  it('has a mean within 3% of half the ceiling, for every retry', () => {
    for (const retry of [1, 2, 3, 4, 8, 20]) {
      const random = seededRandom(1000 + retry);
      let sum = 0;
      const n = 20_000;
      for (let i = 0; i < n; i++) sum += backoff.delay(retry, random);
      const expected = backoff.ceiling(retry) / 2;
      expect(Math.abs(sum / n - expected) / expected).toBeLessThan(0.03);
    }
  });

  it('refuses a random source outside [0, 1)', () => {
    expect(() => backoff.delay(1, () => 1)).toThrow(RangeError);
    expect(() => backoff.delay(1, () => Number.NaN)).toThrow(RangeError);
    expect(() => backoff.delay(0, () => 0.5)).toThrow(TypeError);
  });
});

describe('no synchronisation (case 28)', () => {
  const histogram = (waits: number[]) => {
    const buckets = new Map<number, number>();
    for (const wait of waits) buckets.set(Math.floor(wait / 100), (buckets.get(Math.floor(wait / 100)) ?? 0) + 1);
    return Math.max(...buckets.values()) / waits.length;
  };

  it('spreads 1,000 senders that failed together: no 100 ms bucket holds more than 5% from the third retry on', () => {
    const backoff = createBackoff({ base: '1s', cap: '1h' });
    const senders = Array.from({ length: 1000 }, (_, i) => seededRandom(i * 7919 + 1));
    for (let retry = 1; retry <= 8; retry++) {
      const waits = senders.map((random) => backoff.delay(retry, random));
      const share = histogram(waits);
      // The first retry waits under 1 s (spec part 8) so it can only spread over ten 100 ms buckets:
      // a uniform spread there is 10% each, and no bucket may hold much more than that.
      const limit = retry === 1 ? 0.15 : retry === 2 ? 0.08 : 0.05;
      expect(share, `retry ${retry}`).toBeLessThanOrEqual(limit);
    }
  });

  it('a fixed schedule fails the same check (the test can fail)', () => {
    const fixed = Array.from({ length: 1000 }, () => 1000);
    expect(histogram(fixed)).toBe(1);
  });
});
