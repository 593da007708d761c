import { afterEach, describe, expect, it, vi } from 'vitest';
import { createDeadlines } from '../src/deadlines.js';

afterEach(() => {
  vi.useRealTimers();
});

describe('createDeadlines', () => {
  // Limits the sweeper's interval does not divide, so "late" is visible: below a second, where the
  // interval is a quarter of the limit, and above it, where it is capped at 250 ms.
  it.each([401, 1_001])(
    'fails a call that does not answer never early, and at most a quarter of the limit late (%i ms)',
    async (limitMs) => {
      vi.useFakeTimers();
      const withDeadline = createDeadlines(limitMs);
      let failure: Error | undefined;
      withDeadline('get', () => new Promise<never>(() => undefined)).catch((error: Error) => {
        failure = error;
      });
      await vi.advanceTimersByTimeAsync(limitMs - 1);
      expect(failure).toBeUndefined();
      await vi.advanceTimersByTimeAsync(Math.floor(limitMs / 4) + 1);
      expect(failure?.message).toBe(`store get timed out after ${limitMs}ms`);
    },
  );
});
