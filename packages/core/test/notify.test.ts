import { describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import { memoryStore } from '../src/memory-store.js';
import { notify } from '../src/notify.js';

// A pending promise that records whether anybody attached a handler to it. A rejecting one would
// fail the whole file with an unhandled rejection rather than the test that let it through.
function watchedPromise() {
  const promise = new Promise<void>(() => undefined);
  return { promise, handlers: vi.spyOn(promise, 'then') };
}

describe('notify', () => {
  it('passes every argument and drops what the observer throws', () => {
    const seen: unknown[] = [];
    notify((a: number, b: string) => seen.push(a, b), 1, 'two');
    expect(seen).toEqual([1, 'two']);
    expect(() =>
      notify(() => {
        throw new Error('observer bug');
      }),
    ).not.toThrow();
    expect(() => notify(undefined, 'event')).not.toThrow();
  });

  it('handles the promise an async observer returns, so its rejection is never unhandled', () => {
    const { promise, handlers } = watchedPromise();
    notify(() => promise);
    expect(handlers).toHaveBeenCalled();
  });

  it('is what the engine and memoryStore call their observers with', async () => {
    const events = watchedPromise();
    const evictions = watchedPromise();
    const store = memoryStore({ maxEntries: 1, now: () => 0, onEvict: () => evictions.promise });
    const engine = createIdempotency({ store, heartbeat: false, now: () => 0, onEvent: () => events.promise });
    const done = { status: 201, headers: {}, body: new Uint8Array() };
    const first = await engine.begin({ key: 'a', scope: 'u', operation: 'POST /x' });
    if (first.kind !== 'execute') throw new Error('expected an execution');
    await engine.complete(first.lease, done);
    await engine.begin({ key: 'b', scope: 'u', operation: 'POST /x' });
    expect(events.handlers).toHaveBeenCalled();
    expect(evictions.handlers).toHaveBeenCalled();
  });
});
