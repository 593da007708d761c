import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createBackoff, createSender, seededRandom } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

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

// Research case 28 (events-anchors.md): "1,000 senders fail at the same instant. In the retry-1
// arrival histogram, no 100 ms bucket holds more than 5% of them (fixed schedules fail this)."
// Departed from at the first two retries, by arithmetic, not by choice of jitter: the spec (part 8)
// wants the first retry after about 1 s, so full jitter spreads it over [0, 1 s), ten 100 ms buckets:
// 10% each at best, never 5%; the second, over [0, 2 s), is 5% at best, and sampling noise puts one
// bucket above it. From the third retry on, case 28's 5% holds as written. docs/webhooks.md says so.
describe('no synchronisation (case 28, held from the third retry on)', () => {
  // The largest share of `times` that falls in one 100 ms bucket.
  const histogram = (times: number[]) => {
    const buckets = new Map<number, number>();
    for (const time of times) buckets.set(Math.floor(time / 100), (buckets.get(Math.floor(time / 100)) ?? 0) + 1);
    return Math.max(...buckets.values()) / times.length;
  };
  // At most 5% (case 28) from the third retry on; near the best the spec's schedule allows before:
  // 10% for the first retry, 5% for the second, with room for the noise of 1,000 draws.
  const limit = (retry: number) => (retry === 1 ? 0.15 : retry === 2 ? 0.08 : 0.05);
  const retries = 8;

  it('1,000 senders that fail at the same instant: their retries arrive with no 100 ms bucket over 5% from the third retry on (retry 1 at most 15%, retry 2 at most 8%)', async () => {
    const start = Date.UTC(2026, 0, 1);
    // Each sender its own random source, as separate processes have; an endpoint that always fails;
    // a clock that the injected sleep moves, so the arrival times are the schedule itself.
    const arrivals = await Promise.all(
      Array.from({ length: 1000 }, async (_, i) => {
        let t = start;
        const at: number[] = [];
        const sender = createSender({
          secret: SECRET,
          schedule: { maxAttempts: retries + 1, horizon: '7d' },
          random: seededRandom(i * 7919 + 1),
          now: () => t,
          sleep: async (ms) => {
            t += ms;
          },
          fetch: (async () => {
            at.push(t - start);
            return new Response(null, { status: 500 });
          }) as typeof fetch,
        });
        await sender.send({ url: 'https://receiver.test/hooks', id: `evt_${i}`, body: '{}' });
        return at;
      }),
    );
    expect(arrivals.every((at) => at.length === retries + 1 && at[0] === 0)).toBe(true);
    for (let retry = 1; retry <= retries; retry++) {
      expect(histogram(arrivals.map((at) => at[retry] as number)), `retry ${retry}`).toBeLessThanOrEqual(limit(retry));
    }
  });

  it("createBackoff's draws, 1,000 sources: no 100 ms bucket over 5% from the third retry on (retry 1 at most 15%, retry 2 at most 8%)", () => {
    const backoff = createBackoff({ base: '1s', cap: '1h' });
    const senders = Array.from({ length: 1000 }, (_, i) => seededRandom(i * 7919 + 1));
    for (let retry = 1; retry <= retries; retry++) {
      const waits = senders.map((random) => backoff.delay(retry, random));
      expect(histogram(waits), `retry ${retry}`).toBeLessThanOrEqual(limit(retry));
    }
  });

  it('the measure puts 1,000 equal waits (a schedule without jitter) in one bucket: 100%', () => {
    expect(histogram(Array.from({ length: 1000 }, () => 1000))).toBe(1);
  });
});
