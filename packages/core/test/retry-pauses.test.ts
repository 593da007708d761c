import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { retryWithPauses } from '../src/index.js';

describe('retryWithPauses', () => {
  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'performance'] });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  const transient = Object.assign(new Error('lock timeout'), { code: '55P03' });
  const retryable = (error: unknown) => (error as { code?: unknown }).code === '55P03';

  it('runs again after pauses of 250 ms, doubling, until the attempt succeeds', async () => {
    const at: number[] = [];
    let calls = 0;
    const done = retryWithPauses(
      async () => {
        at.push(performance.now());
        if (++calls < 4) throw transient;
        return 'ok';
      },
      { retryable, budgetMs: 30_000 },
    );
    await vi.runAllTimersAsync();
    expect(await done).toBe('ok');
    expect(at.map((t, i) => (i === 0 ? 0 : t - (at[i - 1] as number)))).toEqual([0, 250, 500, 1_000]);
  });

  it('gives up with the last error once the next pause would pass the budget', async () => {
    let calls = 0;
    const done = retryWithPauses(
      async () => {
        calls++;
        throw transient;
      },
      { retryable, budgetMs: 1_000 },
    );
    const settled = done.catch((error: unknown) => error);
    await vi.runAllTimersAsync();
    expect(await settled).toBe(transient);
    // Tries at 0, 250 and 750 ms; the next pause (1 s) would end past the budget.
    expect(calls).toBe(3);
  });

  it('rejects at once with an error it may not retry', async () => {
    const other = new Error('syntax');
    let calls = 0;
    await expect(
      retryWithPauses(
        async () => {
          calls++;
          throw other;
        },
        { retryable, budgetMs: 30_000 },
      ),
    ).rejects.toBe(other);
    expect(calls).toBe(1);
  });
});
