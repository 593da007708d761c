import { afterEach, expect, it, vi } from 'vitest';
import { createClient, lateTimeout, maxTimerMs, RequestFailedError } from '../src/index.js';

afterEach(() => {
  vi.useRealTimers();
});

const day = 86_400_000;

// setTimeout holds at most 2^31 - 1 ms (about 24.9 days). lateTimeout clamped a longer wait to that,
// so a per-attempt timeout of 30 days cut the attempt off after 24.9.
it('lateTimeout waits in full a time longer than one timer holds', async () => {
  vi.useFakeTimers();
  const fired = vi.fn();
  lateTimeout(30 * day, fired);
  await vi.advanceTimersByTimeAsync(maxTimerMs + 1_000);
  expect(fired).not.toHaveBeenCalled();
  await vi.advanceTimersByTimeAsync(30 * day - maxTimerMs);
  expect(fired).toHaveBeenCalledTimes(1);
});

it('lateTimeout cancelled during a later step never fires', async () => {
  vi.useFakeTimers();
  const fired = vi.fn();
  const cancel = lateTimeout(30 * day, fired);
  await vi.advanceTimersByTimeAsync(maxTimerMs + 1_000);
  cancel();
  await vi.advanceTimersByTimeAsync(30 * day);
  expect(fired).not.toHaveBeenCalled();
});

it("a client's per-attempt timeout of 30 days is not cut at 24.9 days", async () => {
  vi.useFakeTimers();
  let signal: AbortSignal | undefined;
  const client = createClient({
    baseUrl: 'https://api.example',
    // Answers only when the attempt's signal aborts, as fetch does.
    fetch: (_url, init) =>
      new Promise<Response>((_resolve, reject) => {
        signal = init.signal ?? undefined;
        signal?.addEventListener('abort', () => reject(signal?.reason));
      }),
    retry: { timeout: '30d', deadline: false, maxAttempts: 1 },
  });
  const outcome = client.get('/slow').catch((error: unknown) => error);
  await vi.advanceTimersByTimeAsync(25 * day);
  expect(signal?.aborted).toBe(false);
  await vi.advanceTimersByTimeAsync(5 * day + 1_000);
  const error = await outcome;
  expect(error).toBeInstanceOf(RequestFailedError);
  expect((error as RequestFailedError).attempts.map((attempt) => attempt.outcome)).toEqual(['timeout']);
});
