/**
 * A fake clock and a sleep that records each wait and moves the clock forward by it, without
 * waiting for real. Aborting the signal rejects like the real sleep does.
 */
export function fakeTime(start = Date.UTC(2026, 10, 21, 6, 0, 0)) {
  let current = start;
  const waits: number[] = [];
  const hooks: Array<(ms: number) => void | Promise<void>> = [];
  return {
    waits,
    now: () => current,
    advance(ms: number) {
      current += ms;
    },
    /** Runs `hook` inside every later sleep, before it resolves (e.g. to finish a request server-side). */
    onSleep(hook: (ms: number) => void | Promise<void>) {
      hooks.push(hook);
    },
    sleep: async (ms: number, signal?: AbortSignal) => {
      if (signal?.aborted) throw signal.reason;
      waits.push(ms);
      current += ms;
      for (const hook of hooks) await hook(ms);
      if (signal?.aborted) throw signal.reason;
    },
  };
}

/** mulberry32: a small seeded PRNG, uniform in [0, 1), so jitter is reproducible. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}
