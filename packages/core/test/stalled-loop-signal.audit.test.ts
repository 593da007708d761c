// An event loop stalled past the lease (an overloaded 2-core box, a long GC pause) while another
// worker, not stalled, shares the store. concepts.md and the adapter guides promise that the lease's
// signal has aborted "before another worker can take the key over", so that a handler that checks it
// before its effect "cannot make the effect twice".
import { afterEach, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';

afterEach(() => {
  vi.useRealTimers();
});

const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'fp-a' };

// The memory store as a store behind a network, shared by two workers (not in process: the
// heartbeat's end-of-lease watch applies, as for Redis and PostgreSQL).
function networked(inner: Store): Store {
  return {
    claim: (input) => Promise.resolve(inner.claim(input)),
    renew: (input) => Promise.resolve(inner.renew(input)),
    complete: (input) => Promise.resolve(inner.complete(input)),
    release: (input) => Promise.resolve(inner.release(input)),
    get: (id) => Promise.resolve(inner.get(id)),
  };
}

// Was wrong: the signal only aborted when a heartbeat tick ran and found the lease's end passed.
// After a stall, every overdue timer runs in the order it was due, so a handler's own timer (or any
// callback due before the next tick) ran first and read `signal.aborted === false`, though its lease
// ended during the stall and another worker had taken the key over and run it. Measured with Fastify
// on Redis, lease 1 s, a 1.3 s stall every 2.5 s on one of two workers, the handler checking its
// signal after 800 ms of work: 30 of 193 lost leases were not seen by the handler's check, and those
// 30 keys ran twice. Reading the signal now looks at the clock first.
it('a handler that wakes from a stall before the heartbeat sees its lease lost', async () => {
  vi.useFakeTimers();
  const shared = memoryStore({ now: () => Date.now() });
  const stalledWorker = createIdempotency({ store: networked(shared), lease: '1s', now: () => Date.now() });
  const otherWorker = createIdempotency({ store: networked(shared), heartbeat: false, now: () => Date.now() });

  const first = await stalledWorker.begin(request);
  if (first.kind !== 'execute') throw new Error('expected execute');
  // The handler works for 1,740 ms, then checks its signal before its effect.
  let abortedAtEffect: boolean | undefined;
  setTimeout(() => {
    abortedAtEffect = first.lease.signal.aborted;
  }, 1_740);
  // Renewals are confirmed while the loop runs.
  await vi.advanceTimersByTimeAsync(1_700);
  expect(first.lease.signal.aborted).toBe(false);

  // The loop stalls for 1.5 s: no timer runs, the store's lease (last renewed at 1,500 ms at the
  // latest) ends, and the other worker's retry takes the key over.
  vi.setSystemTime(Date.now() + 1_500);
  const retry = await otherWorker.begin(request);
  expect(retry.kind).toBe('execute');

  // The loop wakes: overdue timers run, the handler's first.
  await vi.advanceTimersByTimeAsync(100);
  expect(first.lease.lost).toBe(true);
  expect(abortedAtEffect).toBe(true);
});

it('a signal taken at the start and read after the stall is current too: aborted, throwIfAborted, its listeners', async () => {
  vi.useFakeTimers();
  const shared = memoryStore({ now: () => Date.now() });
  const stalledWorker = createIdempotency({ store: networked(shared), lease: '1s', now: () => Date.now() });
  const first = await stalledWorker.begin(request);
  if (first.kind !== 'execute') throw new Error('expected execute');
  const { signal } = first.lease;
  const heard: string[] = [];
  signal.addEventListener('abort', () => heard.push('abort'));
  await vi.advanceTimersByTimeAsync(500);
  expect(signal.aborted).toBe(false);
  expect(() => signal.throwIfAborted()).not.toThrow();
  vi.setSystemTime(Date.now() + 1_500);
  // No timer has run since the stall: the read itself finds the lease's end passed.
  expect(() => signal.throwIfAborted()).toThrow(/lease lost/i);
  expect(signal.aborted).toBe(true);
  expect(heard).toEqual(['abort']);
  expect(first.lease.lost).toBe(true);
});

it('an in-process store, shared by nobody, is not judged by the clock on a read', async () => {
  vi.useFakeTimers();
  const store = memoryStore({ now: () => Date.now() });
  const worker = createIdempotency({ store, lease: '1s', now: () => Date.now() });
  const first = await worker.begin(request);
  if (first.kind !== 'execute') throw new Error('expected execute');
  const { signal } = first.lease;
  vi.setSystemTime(Date.now() + 1_500);
  expect(signal.aborted).toBe(false);
});
