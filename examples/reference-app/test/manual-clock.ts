/**
 * A clock and a timer the test moves by hand, for the counted-line loggers (counted-lines.ts):
 * `now` and `schedule` as their options take them, `advance` to move time and run what fell due.
 *
 * @example
 * ```ts
 * const clock = manualClock();
 * const log = refusalLogger({ write, now: clock.now, schedule: clock.schedule });
 * clock.advance(60_000);
 * ```
 */
export function manualClock() {
  let at = 1_000_000;
  const timers: { due: number; run: () => void; cancelled: boolean }[] = [];
  return {
    now: () => at,
    schedule(run: () => void, ms: number) {
      const timer = { due: at + ms, run, cancelled: false };
      timers.push(timer);
      return {
        cancel: () => {
          timer.cancelled = true;
        },
      };
    },
    advance(ms: number) {
      at += ms;
      for (const timer of timers.splice(0)) {
        if (timer.cancelled) continue;
        if (timer.due <= at) timer.run();
        else timers.push(timer);
      }
    },
    pending: () => timers.filter((timer) => !timer.cancelled).length,
  };
}
