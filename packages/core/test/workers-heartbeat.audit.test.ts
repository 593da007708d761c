import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createIdempotency, memoryStore } from '../src/index.js';

// Cloudflare Workers (workerd) runs a timer only while the request that set it is alive: once that
// request has answered, its setTimeout/setInterval callbacks never run. This wraps the (fake) timers
// so that timers set while a request runs are cleared when it ends, as workerd does. Seen in
// Miniflare 4.20260426 with nodejs_compat: a quick keyed POST, then a 3.5 s one with a 1 s lease, then
// a duplicate of the slow one at 2.5 s: the duplicate ran the handler a second time (the slow one's
// lease had not been renewed, so it was taken over); in a fresh isolate the duplicate got 409.
function requestScopedTimers() {
  const fakeSetInterval = globalThis.setInterval;
  const fakeSetTimeout = globalThis.setTimeout;
  let owner: Array<() => void> | undefined;
  const track = <T>(timer: T, clear: (timer: T) => void) => {
    owner?.push(() => clear(timer));
    return timer;
  };
  globalThis.setInterval = ((...args: Parameters<typeof setInterval>) =>
    track(fakeSetInterval(...args), clearInterval)) as typeof setInterval;
  globalThis.setTimeout = ((...args: Parameters<typeof setTimeout>) =>
    track(fakeSetTimeout(...args), clearTimeout)) as typeof setTimeout;
  return {
    /** Starts a request: timers set from now on are its own until the next start. */
    start() {
      const timers: Array<() => void> = [];
      owner = timers;
      return {
        /** The request has answered: its timers never run again. */
        end() {
          if (owner === timers) owner = undefined;
          for (const clear of timers) clear();
        },
      };
    },
    restore() {
      globalThis.setInterval = fakeSetInterval;
      globalThis.setTimeout = fakeSetTimeout;
    },
  };
}

const input = (key: string) => ({ key, scope: 'user:alice', operation: 'POST /orders', fingerprint: 'f' });
const response = { status: 201, headers: {}, body: new TextEncoder().encode('{}') };

describe('lease renewal on a runtime whose timers die with their request (Cloudflare Workers)', () => {
  let timers: ReturnType<typeof requestScopedTimers>;
  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date', 'performance'] });
    timers = requestScopedTimers();
  });
  afterEach(() => {
    timers.restore();
    vi.useRealTimers();
    vi.unstubAllGlobals();
  });

  // The emulation is faithful where the engine already works: a heartbeat started by the live request.
  it('a slow first request keeps its key past three leases: a duplicate gets 409', async () => {
    const engine = createIdempotency({ store: memoryStore({ now: () => Date.now() }), lease: '1s' });
    timers.start();
    const slow = await engine.begin(input('k-2'));
    expect(slow.kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(2500);
    timers.start();
    const duplicate = await engine.begin(input('k-2'));
    expect(duplicate.kind === 'reject' && duplicate.error.code).toBe('in_progress');
  });

  // The shared heartbeat (setInterval) is started by the first request that claims and cleared by
  // its own tick once no lease is held. On Workers the request that started it has answered by then,
  // so the interval never ticks again and is never cleared: no later lease is renewed, and a retry
  // takes a running handler's key over after one lease (the handler runs twice). What remains of it
  // on Workers: nothing renews a lease whose own request set no timer.
  it('with the shared heartbeat forced on, a slow request after a quick one loses its key', async () => {
    const engine = createIdempotency({ store: memoryStore({ now: () => Date.now() }), lease: '1s', heartbeat: true });
    await slowAfterQuick(engine);
    const duplicate = await engine.begin(input('k-2'));
    expect(duplicate.kind).toBe('execute');
  });

  // So each claim sets its own renewal timer, in its own request (`heartbeat: 'per-lease'`), which
  // is the default where navigator.userAgent says Cloudflare-Workers.
  for (const [name, options] of [
    ["heartbeat: 'per-lease'", { heartbeat: 'per-lease' }],
    ['the default on Cloudflare Workers', {}],
  ] as const) {
    it(`a slow request after a quick one keeps its key past three leases (${name}): a duplicate gets 409`, async () => {
      vi.stubGlobal('navigator', { userAgent: 'Cloudflare-Workers' });
      const engine = createIdempotency({ store: memoryStore({ now: () => Date.now() }), lease: '1s', ...options });
      await slowAfterQuick(engine);
      const duplicate = await engine.begin(input('k-2'));
      expect(duplicate.kind === 'reject' && duplicate.error.code).toBe('in_progress');
    });
  }

  it('per lease, a slow request outlives the one that claimed before it and still keeps its key', async () => {
    const engine = createIdempotency({
      store: memoryStore({ now: () => Date.now() }),
      lease: '1s',
      heartbeat: 'per-lease',
    });
    const first = timers.start();
    const short = await engine.begin(input('k-1'));
    timers.start();
    const long = await engine.begin(input('k-2'));
    expect(long.kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(500);
    if (short.kind !== 'execute') throw new Error(short.kind);
    await engine.complete(short.lease, response);
    first.end();
    await vi.advanceTimersByTimeAsync(2500);
    timers.start();
    const duplicate = await engine.begin(input('k-2'));
    expect(duplicate.kind === 'reject' && duplicate.error.code).toBe('in_progress');
  });

  it('per lease, a settled lease leaves no timer behind, and a lease past maxExecution is given up', async () => {
    const events: string[] = [];
    const engine = createIdempotency({
      store: memoryStore({ now: () => Date.now() }),
      lease: '1s',
      heartbeat: 'per-lease',
      maxExecution: '2s',
      onEvent: (event) => {
        if (event.type === 'lease-lost') events.push(event.reason);
      },
    });
    const before = vi.getTimerCount();
    const done = await engine.begin(input('k-1'));
    if (done.kind !== 'execute') throw new Error(done.kind);
    expect(vi.getTimerCount()).toBe(before + 1);
    await engine.complete(done.lease, response);
    expect(vi.getTimerCount()).toBe(before);
    const stuck = await engine.begin(input('k-2'));
    if (stuck.kind !== 'execute') throw new Error(stuck.kind);
    await vi.advanceTimersByTimeAsync(2500);
    expect(events).toEqual(['max-execution']);
    expect(stuck.lease.signal.aborted).toBe(true);
    expect(vi.getTimerCount()).toBe(before);
  });

  it("refuses a heartbeat that is neither a boolean nor 'per-lease'", () => {
    expect(() => createIdempotency({ store: memoryStore(), heartbeat: 'shared' as unknown as boolean })).toThrow(
      "heartbeat must be a boolean or 'per-lease'",
    );
  });

  // A quick keyed request, then a slow one in another request: 2.5 s later (past two of its 1 s
  // leases), in a third request, the caller asks again.
  async function slowAfterQuick(engine: ReturnType<typeof createIdempotency>) {
    const first = timers.start();
    const quick = await engine.begin(input('k-1'));
    if (quick.kind !== 'execute') throw new Error(quick.kind);
    await engine.complete(quick.lease, response);
    first.end();
    timers.start();
    const slow = await engine.begin(input('k-2'));
    expect(slow.kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(2500);
    timers.start();
  }
});
