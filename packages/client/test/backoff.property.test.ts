import { backoffCeiling, backoffDelay, type Jitter } from '@idem/client';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

describe('backoff properties', () => {
  it('every wait is within [lower, ceiling] and never above the cap', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 200 }),
        fc.integer({ min: 0, max: 60_000 }),
        fc.integer({ min: 0, max: 600_000 }),
        fc.constantFrom<Jitter>('full', 'equal', 'none'),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        (retry, base, cap, jitter, r) => {
          const ceiling = backoffCeiling(retry, base, cap);
          const wait = backoffDelay(retry, { baseDelayMs: base, maxDelayMs: cap, jitter, random: () => r });
          const lower = jitter === 'full' ? 0 : jitter === 'equal' ? Math.floor(ceiling / 2) : Math.round(ceiling);
          expect(ceiling).toBeLessThanOrEqual(cap);
          expect(wait).toBeGreaterThanOrEqual(lower);
          expect(wait).toBeLessThanOrEqual(Math.round(ceiling));
        },
      ),
    );
  });

  it('ceilings never shrink from one retry to the next', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 100 }),
        fc.integer({ min: 1, max: 10_000 }),
        fc.integer({ min: 1, max: 10 ** 6 }),
        (n, base, cap) => {
          expect(backoffCeiling(n + 1, base, cap)).toBeGreaterThanOrEqual(backoffCeiling(n, base, cap));
        },
      ),
    );
  });
});
