/** setTimeout fires at once for delays above 2^31 - 1 ms (about 24.9 days): the longest one timer holds. */
export const maxTimerMs = 2_147_483_647;

/**
 * Waits `ms` milliseconds, or rejects with the signal's reason as soon as `signal` aborts. The
 * client's default way to wait between attempts (pass your own `sleep` to record waits in tests), and
 * `@idem/webhooks`' between a sender's attempts and a relay's polls. Waits longer than a timer can
 * hold (about 24.9 days) are waited in full, not cut short. The abort listener is removed when the
 * wait ends, however it ends: a loop that waits on one long-lived signal adds no listener per wait.
 *
 * @example
 * await abortableSleep(1000, controller.signal);
 */
export function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    let left = ms;
    let timer: ReturnType<typeof setTimeout>;
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    // Longer waits are taken in steps a timer can hold.
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
