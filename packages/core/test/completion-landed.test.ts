// A completion the store made but whose answer was lost (the connection dropped after the write, a
// timeout that fired as it landed) is tried again in the background, its lease back among the
// heartbeat's. A renewal of that lease then finds the record completed, by this very execution.
import { afterEach, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyEvent } from '../src/events.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';

afterEach(() => {
  vi.useRealTimers();
});

const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'a'.repeat(64) };
const response = { status: 201, headers: {}, body: new Uint8Array([1]) };

it('a completion that landed unannounced is reported as stored, not as a lease lost', async () => {
  vi.useFakeTimers();
  const shared = memoryStore({ now: () => Date.now() });
  let dropAnswer = true;
  // The memory store behind a network: the first completion is written, then its answer is lost.
  const store: Store = {
    claim: (input) => Promise.resolve(shared.claim(input)),
    renew: (input) => Promise.resolve(shared.renew(input)),
    complete: (input) => {
      const done = shared.complete(input);
      if (!dropAnswer) return Promise.resolve(done);
      dropAnswer = false;
      return Promise.reject(new Error('connection reset after the write'));
    },
    release: (input) => Promise.resolve(shared.release(input)),
    get: (id) => Promise.resolve(shared.get(id)),
  };
  const events: IdempotencyEvent[] = [];
  // A lease of 300 ms: the heartbeat ticks every 75 ms, so a renewal falls inside the 100 ms
  // before the completion is tried again.
  const worker = createIdempotency({
    store,
    lease: '300ms',
    now: () => Date.now(),
    onEvent: (event) => events.push(event),
  });
  const started = await worker.begin(request);
  if (started.kind !== 'execute') throw new Error('expected execute');
  await vi.advanceTimersByTimeAsync(250);
  expect(await worker.complete(started.lease, response)).toMatchObject({ ok: false, reason: 'store-error' });
  await vi.advanceTimersByTimeAsync(1_000);

  expect(events.filter((event) => event.type === 'lease-lost')).toEqual([]);
  expect(events.filter((event) => event.type === 'complete')).toHaveLength(1);
  expect(started.lease.signal.aborted).toBe(false);
  expect(shared.get((started.lease as { id: string }).id)).toMatchObject({ state: 'completed' });
});
