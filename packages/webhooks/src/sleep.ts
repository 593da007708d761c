/** setTimeout fires at once for delays above 2^31 - 1 ms (about 24.9 days): the longest one timer holds. */
export const maxTimerMs = 2_147_483_647;

/**
 * Waits `ms` milliseconds, or rejects with the signal's reason as soon as `signal` aborts. Waits
 * longer than one timer holds (about 24.9 days) are taken in steps, so they are waited in full
 * instead of ending after 1 ms. The abort listener is removed when the wait ends, however it ends:
 * a loop that waits on one long-lived signal adds no listener per wait.
 *
 * The sender's default sleep and the relay's pause between polls. (`@idem/client` has its own; this
 * package does not depend on it.)
 *
 * @example
 * await abortableSleep(30 * 86_400_000, controller.signal); // 30 days, in two timers
 */
export function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    let left = ms;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const step = () => {
      if (left > maxTimerMs) {
        left -= maxTimerMs;
        timer = setTimeout(step, maxTimerMs);
        return;
      }
      timer = setTimeout(() => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }, left);
    };
    step();
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
