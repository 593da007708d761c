/**
 * Waits `ms` milliseconds, or rejects with the signal's reason as soon as `signal` aborts. The
 * client's default way to wait between attempts; pass your own `sleep` to record waits in tests.
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
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
