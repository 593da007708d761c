// Adversarial review of the deadlines that now fail one event-loop turn late (setImmediate after the
// sweep): a call that never answers still fails, nothing stays pending, and the sweeper stops.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createDeadlines } from '../src/deadlines.js';

describe('createDeadlines, failing on the turn after the sweep', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('a call that never answers fails, and then no timer of the sweeper is left', async () => {
    let t = 0;
    const withDeadline = createDeadlines(100, () => t);
    const answer = withDeadline('claim', () => new Promise<never>(() => undefined));
    const outcome = answer.then(
      () => 'resolved',
      (error: Error) => error.message,
    );
    t = 99;
    await vi.advanceTimersByTimeAsync(99);
    expect(vi.getTimerCount()).toBeGreaterThan(0);
    t = 150;
    await vi.advanceTimersByTimeAsync(51);
    // The sweep found it overdue; it fails on the turn after (an immediate, run here).
    await vi.advanceTimersByTimeAsync(0);
    expect(await outcome).toBe('store claim timed out after 100ms');
    expect(vi.getTimerCount()).toBe(0);
  });
});
