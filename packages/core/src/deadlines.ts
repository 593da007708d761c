/**
 * Time limits for store calls without a timer per call.
 *
 * A `setTimeout` + `Promise.race` per store operation costs more than the memory store's whole
 * claim, so pending calls are kept in one set and a single unref'd interval fails the overdue
 * ones. A call may therefore fail up to a quarter of the limit late; it never fails early.
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

  const sweep = () => {
    const t = now();
    for (const entry of pending) {
      if (entry.deadline > t) continue;
      pending.delete(entry);
      entry.reject(new Error(`store ${entry.operation} timed out after ${limitMs}ms`));
    }
    if (pending.size === 0 && timer !== undefined) {
      clearInterval(timer);
      timer = undefined;
    }
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
