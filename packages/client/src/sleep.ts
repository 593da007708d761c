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
    // Its callback runs on a later turn, by when onAbort is defined.
    const cancel = after(ms, () => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    });
    const onAbort = () => {
      cancel();
      reject(signal?.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Calls `onTimeout` once `ms` have passed, one turn of the event loop after its timer fires, and
 * returns what cancels it. After a stall of the whole program (frozen by SIGSTOP, `docker pause` or
 * a Lambda freeze; a long GC pause), timers run before any socket is read: an answer that arrived
 * during the stall would be cut off unread by a timeout fired in that same timer phase, and an
 * operation the server carried out reported as timed out (or sent again). The second step is a
 * timer too, which a browser has.
 *
 * @example
 * const cancel = lateTimeout(15_000, () => controller.abort(new Error('attempt timed out')));
 * try { await fetch(url, { signal: controller.signal }); } finally { cancel(); }
 */
export function lateTimeout(ms: number, onTimeout: () => void): () => void {
  let late: ReturnType<typeof setTimeout> | undefined;
  // Waited in steps as abortableSleep waits (see `after`): clamped, a per-attempt timeout of 30 days
  // would cut the attempt off after 24.9.
  const cancel = after(Math.max(0, ms), () => {
    late = setTimeout(onTimeout, 0);
  });
  return () => {
    cancel();
    clearTimeout(late);
  };
}

/**
 * Calls `then` once `ms` have passed, and returns what cancels it. A time longer than one timer holds
 * (2^31 - 1 ms, about 24.9 days; Node fires a longer one at once) is waited in steps a timer can hold.
 */
function after(ms: number, then: () => void): () => void {
  let left = ms;
  let timer: ReturnType<typeof setTimeout>;
  const step = () => {
    if (left > maxTimerMs) {
      left -= maxTimerMs;
      timer = setTimeout(step, maxTimerMs);
      return;
    }
    timer = setTimeout(then, left);
  };
  step();
  return () => clearTimeout(timer);
}
