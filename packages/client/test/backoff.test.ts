import { backoffCeiling, backoffDelay, createClient, retryAfterSpread, retryWait } from '@idem/client';
import { describe, expect, it } from 'vitest';
import { empty, scriptedFetch } from './support/fake-fetch.js';
import { fakeTime, seededRandom } from './support/fake-time.js';

describe('backoff', () => {
  it('has ceilings of about 1 s, 2 s, 4 s ... up to the cap', () => {
    expect([1, 2, 3, 4, 5, 6, 7].map((n) => backoffCeiling(n, 1000, 30_000))).toEqual([
      1000, 2000, 4000, 8000, 16_000, 30_000, 30_000,
    ]);
    expect(backoffCeiling(5000, 1000, 30_000)).toBe(30_000);
  });

  it('keeps every wait of a seeded run inside its full-jitter bounds, and the cap', async () => {
    for (const seed of [1, 2, 3, 42, 1337]) {
      const time = fakeTime();
      const { fetch } = scriptedFetch([empty(503)]);
      const client = createClient({
        baseUrl: 'https://api.example.test',
        fetch,
        random: seededRandom(seed),
        sleep: time.sleep,
        now: time.now,
        retry: { maxAttempts: 12, baseDelay: '1s', maxDelay: '10s', deadline: false },
      });
      await expect(client.post('/charges', {})).rejects.toMatchObject({ code: 'attempts_exhausted' });
      expect(time.waits).toHaveLength(11);
      time.waits.forEach((wait, i) => {
        const ceiling = Math.min(10_000, 1000 * 2 ** i);
        expect(wait).toBeGreaterThanOrEqual(0);
        expect(wait).toBeLessThanOrEqual(ceiling);
        expect(Number.isInteger(wait)).toBe(true);
      });
      // Late waits are capped: nothing above 10 s, however many retries.
      expect(Math.max(...time.waits)).toBeLessThanOrEqual(10_000);
    }
  });

  it('is reproducible with the same seed and differs with another', async () => {
    const run = async (seed: number) => {
      const time = fakeTime();
      const client = createClient({
        baseUrl: 'https://api.example.test',
        fetch: scriptedFetch([empty(503)]).fetch,
        random: seededRandom(seed),
        sleep: time.sleep,
        now: time.now,
        retry: { maxAttempts: 6, deadline: false },
      });
      await client.get('/x').catch(() => undefined);
      return time.waits;
    };
    expect(await run(9)).toEqual(await run(9));
    expect(await run(9)).not.toEqual(await run(10));
  });

  it('spreads full jitter over the whole range (not bunched at the ceiling)', () => {
    const random = seededRandom(5);
    const waits = Array.from({ length: 2000 }, () =>
      backoffDelay(3, { baseDelayMs: 1000, maxDelayMs: 30_000, jitter: 'full', random }),
    );
    const low = waits.filter((w) => w < 2000).length;
    // Uniform on [0, 4000]: about half below 2000.
    expect(low).toBeGreaterThan(850);
    expect(low).toBeLessThan(1150);
  });

  it('equal jitter stays in the upper half; none is the ceiling', () => {
    const random = seededRandom(11);
    for (let n = 1; n <= 8; n++) {
      const ceiling = backoffCeiling(n, 500, 20_000);
      const wait = backoffDelay(n, { baseDelayMs: 500, maxDelayMs: 20_000, jitter: 'equal', random });
      expect(wait).toBeGreaterThanOrEqual(ceiling / 2);
      expect(wait).toBeLessThanOrEqual(ceiling);
      expect(backoffDelay(n, { baseDelayMs: 500, maxDelayMs: 20_000, jitter: 'none', random })).toBe(ceiling);
    }
  });

  it('clamps a misbehaving random source into the bounds', () => {
    const schedule = { baseDelayMs: 1000, maxDelayMs: 30_000, jitter: 'full' as const };
    expect(backoffDelay(1, { ...schedule, random: () => 7 })).toBe(1000);
    expect(backoffDelay(1, { ...schedule, random: () => -3 })).toBe(0);
    expect(backoffDelay(1, { ...schedule, random: () => Number.NaN })).toBe(0);
  });

  it('retryWait: the backoff when it is as long as Retry-After; else Retry-After and a jittered spread past it', () => {
    const schedule = (r: number, jitter: 'full' | 'equal' | 'none' = 'full') => ({
      baseDelayMs: 1000,
      maxDelayMs: 30_000,
      jitter,
      random: () => r,
    });
    // No Retry-After, or a shorter one: the backoff alone.
    expect(retryWait(3, schedule(0.5), undefined)).toBe(2000);
    expect(retryWait(3, schedule(0.5), 1500)).toBe(2000);
    // Longer: Retry-After, plus up to a fifth of it and at most the base delay, by the same draw.
    expect(retryWait(1, schedule(0), 5000)).toBe(5000);
    expect(retryWait(1, schedule(0.5), 5000)).toBe(5500);
    expect(retryWait(1, schedule(1), 5000)).toBe(6000);
    expect(retryWait(1, schedule(1), 2000)).toBe(2400);
    expect(retryWait(1, schedule(0.5, 'equal'), 5000)).toBe(5750);
    // Without jitter, exactly what the server asked for.
    expect(retryWait(1, schedule(0.5, 'none'), 5000)).toBe(5000);
    expect(retryAfterSpread(60_000, 1000)).toBe(1000);
    expect(retryAfterSpread(1000, 1000)).toBe(200);
  });

  it('retryWait spreads a crowd told one Retry-After over its spread, never below it', () => {
    const random = seededRandom(7);
    const waits = Array.from({ length: 2000 }, () =>
      retryWait(1, { baseDelayMs: 1000, maxDelayMs: 30_000, jitter: 'full', random }, 5000),
    );
    expect(Math.min(...waits)).toBeGreaterThanOrEqual(5000);
    expect(Math.max(...waits)).toBeLessThanOrEqual(6000);
    // Uniform on [5000, 6000]: about half in each half.
    const low = waits.filter((w) => w < 5500).length;
    expect(low).toBeGreaterThan(850);
    expect(low).toBeLessThan(1150);
  });
});
