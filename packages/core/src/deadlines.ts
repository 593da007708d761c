/**
 * The failure of a store call that did not answer within its limit: the store could not be
 * reached, as far as the caller can tell (`storeUnavailable: 'fail-open'` tells it so from an error
 * the store answered with). A plain `Error` otherwise, message and all.
 */
export class StoreTimeoutError extends Error {}

/**
 * Time limits for store calls without a timer per call.
 *
 * A `setTimeout` + `Promise.race` per store operation costs more than the memory store's whole
 * claim, so pending calls are kept in one set and a single unref'd interval fails the overdue
 * ones. A call may therefore fail up to a quarter of the limit late (and one turn of the event loop,
 * see `failOverdue`); it never fails early.
 * `now` is a monotonic clock by default: a wall clock stepped back would let a hung call hang for
 * the size of the step, one stepped forward fail calls a healthy store was answering.
 */
export function createDeadlines(limitMs: number, now: () => number = () => performance.now()) {
  interface Pending {
    deadline: number;
    operation: string;
    reject: (error: Error) => void;
  }
  const pending = new Set<Pending>();
  let timer: ReturnType<typeof setInterval> | undefined;
  const every = Math.max(5, Math.min(250, Math.floor(limitMs / 4)));

  const stopWhenIdle = () => {
    if (pending.size === 0 && timer !== undefined) {
      clearInterval(timer);
      timer = undefined;
    }
  };

  // Overdue calls are failed on the next turn of the event loop, after its I/O phase, not in the
  // timer phase that found them. After the process was stalled (frozen by SIGSTOP, `docker pause`, a
  // Lambda freeze, a long GC pause), timers run before any socket is read, so an answer that arrived
  // during the stall sits unread while its deadline has passed: failed here, a completion the store
  // did make would be reported failed (and retried), a claim it granted answered 503.
  const failOverdue = (overdue: Pending[]) => {
    for (const entry of overdue) {
      // Still pending: its answer was not in during the I/O phase either.
      if (pending.delete(entry))
        entry.reject(new StoreTimeoutError(`store ${entry.operation} timed out after ${limitMs}ms`));
    }
    stopWhenIdle();
  };

  const sweep = () => {
    const t = now();
    let overdue: Pending[] | undefined;
    for (const entry of pending) {
      if (entry.deadline > t) continue;
      if (overdue === undefined) overdue = [];
      overdue.push(entry);
    }
    if (overdue !== undefined) setImmediate(failOverdue, overdue);
    else stopWhenIdle();
  };

  return function withDeadline<T>(operation: string, work: () => T | Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const entry: Pending = { deadline: now() + limitMs, operation, reject };
      pending.add(entry);
      if (timer === undefined) {
        timer = setInterval(sweep, every);
        timer.unref?.();
      }
      let call: Promise<T>;
      try {
        call = Promise.resolve(work());
      } catch (error) {
        call = Promise.reject(error);
      }
      call.then(
        (value) => {
          pending.delete(entry);
          resolve(value);
        },
        (error) => {
          pending.delete(entry);
          reject(error);
        },
      );
    });
  };
}
