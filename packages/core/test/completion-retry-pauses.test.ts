// The pauses between the background retries of a failed completion (`retryCompletion`): the
// production schedule, pinned pause by pause on fake timers, and the internal registry-symbol
// option that lets a conformance table (testkit's describeAdapter) run them without 3.1 s of real
// waiting per scenario.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import { completionRetryPauses } from '../src/engine-hooks.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';

afterEach(() => {
  vi.useRealTimers();
});

const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'a'.repeat(64) };
const response = { status: 201, headers: {}, body: new Uint8Array([1]) };

// The memory store behind a network (answers as promises) whose completions always fail.
function failingCompletions() {
  const inner = memoryStore({ now: () => Date.now() });
  const calls = { complete: 0, release: 0 };
  const store: Store = {
    claim: (input) => Promise.resolve(inner.claim(input)),
    renew: (input) => Promise.resolve(inner.renew(input)),
    complete: () => {
      calls.complete++;
      return Promise.reject(new Error('connection reset'));
    },
    release: (input) => {
      calls.release++;
      return Promise.resolve(inner.release(input));
    },
    get: (id) => Promise.resolve(inner.get(id)),
  };
  return { inner, store, calls };
}

describe('the pauses before each retry of a failed completion', () => {
  it('are 100, 200, 400, 800 and 1600 ms in production, then the key is released', async () => {
    vi.useFakeTimers();
    const { inner, store, calls } = failingCompletions();
    const engine = createIdempotency({ store, now: () => Date.now() });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    expect(await engine.complete(started.lease, response)).toMatchObject({ ok: false, reason: 'store-error' });
    expect(calls.complete).toBe(1);
    // Each pause exactly: one millisecond short of it, no new attempt; at it, the next one.
    for (const [index, pause] of [100, 200, 400, 800, 1_600].entries()) {
      await vi.advanceTimersByTimeAsync(pause - 1);
      expect(calls.complete, `before pause ${index + 1} (${pause} ms) ends`).toBe(index + 1);
      await vi.advanceTimersByTimeAsync(1);
      expect(calls.complete, `once pause ${index + 1} (${pause} ms) ends`).toBe(index + 2);
    }
    // The fifth retry failed: the key is released at once, and nothing is tried again.
    expect(calls.release).toBe(1);
    await vi.advanceTimersByTimeAsync(60_000);
    expect([calls.complete, calls.release]).toEqual([6, 1]);
    expect(inner.get(started.lease.id)).toBeUndefined();
  });

  it('are what the internal option says when it is set (as testkit sets it), as many retries as in production', async () => {
    vi.useFakeTimers();
    const { inner, store, calls } = failingCompletions();
    const asked: number[] = [];
    const engine = createIdempotency({
      store,
      now: () => Date.now(),
      // Not a public option: a registry symbol, which the option-name check (string names) ignores.
      [completionRetryPauses]: (attempt: number) => {
        asked.push(attempt);
        return 1;
      },
    } as Parameters<typeof createIdempotency>[0]);
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(started.lease, response);
    await vi.advanceTimersByTimeAsync(5);
    expect([calls.complete, calls.release]).toEqual([6, 1]);
    expect(asked).toEqual([0, 1, 2, 3, 4]);
    expect(inner.get(started.lease.id)).toBeUndefined();
  });

  it('reach the engine through the HTTP layer, whose options the adapters pass as they are', async () => {
    vi.useFakeTimers();
    const { store, calls } = failingCompletions();
    const http = createHttpIdempotency({
      store,
      now: () => Date.now(),
      [completionRetryPauses]: () => 1,
    } as Parameters<typeof createHttpIdempotency>[0]);
    const started = await http.engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    await http.engine.complete(started.lease, response);
    await vi.advanceTimersByTimeAsync(5);
    expect([calls.complete, calls.release]).toEqual([6, 1]);
  });

  it('is the registry symbol testkit names, so that no package has to export it', () => {
    expect(completionRetryPauses).toBe(Symbol.for('@idem/core.completionRetryPauses'));
  });

  it('refuses an internal value that is no function, at construction', () => {
    const { store } = failingCompletions();
    expect(() =>
      createIdempotency({ store, [completionRetryPauses]: [1, 1] } as Parameters<typeof createIdempotency>[0]),
    ).toThrow(TypeError);
  });
});
