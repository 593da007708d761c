// Adversarial review of the background completion retry (`completeFailed` / `retryCompletion`): a
// completion that fails is tried again with its lease put back among the heartbeat's leases. The
// key may have changed hands meanwhile, in this very process.
import { afterEach, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyEvent } from '../src/events.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';
import { ResponseTooLargeError } from '../src/stored-response.js';

afterEach(() => {
  vi.useRealTimers();
});

const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'a'.repeat(64) };
const response = { status: 201, headers: {}, body: new Uint8Array([1]) };

// The memory store behind a network whose completions never answer while `hang` is set.
function slowCompletions(inner: Store) {
  const link = { hang: false };
  const store: Store = {
    claim: (input) => Promise.resolve(inner.claim(input)),
    renew: (input) => Promise.resolve(inner.renew(input)),
    complete: (input) => (link.hang ? new Promise<boolean>(() => {}) : Promise.resolve(inner.complete(input))),
    release: (input) => Promise.resolve(inner.release(input)),
    get: (id) => Promise.resolve(inner.get(id)),
  };
  return { store, link };
}

it('a completion retried after its key was taken over in this process leaves the new lease renewed', async () => {
  vi.useFakeTimers();
  const shared = memoryStore({ now: () => Date.now() });
  const { store, link } = slowCompletions(shared);
  const events: IdempotencyEvent[] = [];
  const worker = createIdempotency({
    store,
    lease: '1s',
    storeTimeout: '2s',
    now: () => Date.now(),
    onEvent: (event) => events.push(event),
  });
  const other = createIdempotency({ store: shared, heartbeat: false, now: () => Date.now() });

  const first = await worker.begin(request);
  if (first.kind !== 'execute') throw new Error('expected execute');
  // The first completion hangs: no renewals while it does, so the store's lease ends after 1 s.
  link.hang = true;
  const completing = worker.complete(first.lease, response);
  await vi.advanceTimersByTimeAsync(1_200);
  // The client's retry reaches this same process and takes the abandoned key over: a second run.
  const second = await worker.begin(request);
  if (second.kind !== 'execute') throw new Error('expected the takeover to execute');
  expect(second.lease.recovered).toBe(true);
  link.hang = false;
  // The first completion times out, is retried in the background and is fenced (the token moved on).
  await vi.advanceTimersByTimeAsync(1_500);
  expect(await completing).toMatchObject({ ok: false, reason: 'store-error' });
  await vi.advanceTimersByTimeAsync(200);
  expect(first.lease.lost).toBe(true);

  // The second run's handler keeps working. Its heartbeat must keep its lease: no third run.
  await vi.advanceTimersByTimeAsync(3_000);
  expect((await other.begin(request)).kind).toBe('reject');
  expect(second.lease.signal.aborted).toBe(false);
  expect(await worker.complete(second.lease, response)).toEqual({ ok: true, stored: true });
  expect(events.filter((event) => event.type === 'complete')).toHaveLength(1);
});

// The background retry is for a store that failed, not one that refused the response for what it
// is: a response over the store's cap would be refused on every try while the key stayed held.
it('a completion refused for its size is not tried again: the key is released at once', async () => {
  vi.useFakeTimers();
  const shared = memoryStore({ now: () => Date.now() });
  let completions = 0;
  const store: Store = {
    claim: (input) => Promise.resolve(shared.claim(input)),
    renew: (input) => Promise.resolve(shared.renew(input)),
    complete: () => {
      completions++;
      return Promise.reject(new ResponseTooLargeError(5_000_000, 4_194_304));
    },
    release: (input) => Promise.resolve(shared.release(input)),
    get: (id) => Promise.resolve(shared.get(id)),
  };
  const worker = createIdempotency({ store, now: () => Date.now() });
  const first = await worker.begin(request);
  if (first.kind !== 'execute') throw new Error('expected execute');
  expect(await worker.complete(first.lease, response)).toMatchObject({ ok: false, reason: 'store-error' });
  await vi.advanceTimersByTimeAsync(10_000);
  expect(completions).toBe(1);
  expect((await worker.begin(request)).kind).toBe('execute');
});
