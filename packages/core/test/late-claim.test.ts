// A claim the engine gave up on (storeTimeout passed: the client was answered 503, "nothing was
// executed") may still land at the store later, from a full pool's queue or a busy Redis. Landed for
// nobody, it would hold the key for a lease and then be taken over as a crashed attempt.
import { afterEach, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyEvent } from '../src/events.js';
import { memoryStore } from '../src/memory-store.js';
import type { ClaimInput, ClaimResult, Store } from '../src/store.js';

afterEach(() => {
  vi.useRealTimers();
});

const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'a'.repeat(64) };

// The memory store behind a network whose claims (those `held` picks) land only when `land()` is called.
function queuedClaims(inner: Store, held: (input: ClaimInput) => boolean = () => true) {
  const queued: Array<() => void> = [];
  const store: Store = {
    claim: (input) =>
      held(input)
        ? new Promise<ClaimResult>((resolve) => {
            queued.push(() => resolve(inner.claim(input) as ClaimResult));
          })
        : Promise.resolve(inner.claim(input)),
    renew: (input) => Promise.resolve(inner.renew(input)),
    complete: (input) => Promise.resolve(inner.complete(input)),
    release: (input) => Promise.resolve(inner.release(input)),
    get: (id) => Promise.resolve(inner.get(id)),
  };
  return {
    store,
    land: () => {
      for (const go of queued.splice(0)) go();
    },
  };
}

it('withdraws a claim that lands after its 503: the retry runs at once, not after a lease as a recovery', async () => {
  vi.useFakeTimers();
  const shared = memoryStore({ now: () => Date.now() });
  const { store, land } = queuedClaims(shared);
  const events: IdempotencyEvent[] = [];
  const engine = createIdempotency({
    store,
    storeTimeout: '200ms',
    now: () => Date.now(),
    onEvent: (e) => events.push(e),
  });
  const refused = engine.begin(request);
  await vi.advanceTimersByTimeAsync(300);
  expect(await refused).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable' } });
  land();
  await vi.advanceTimersByTimeAsync(0);
  // Landed, then withdrawn: nothing is held.
  const direct = createIdempotency({ store: shared, now: () => Date.now() });
  const retry = await direct.begin(request);
  expect(retry.kind).toBe('execute');
  expect(retry.kind === 'execute' && retry.lease.recovered).toBe(false);
  expect(events.map((event) => event.type)).toEqual(['store-error']);
});

it("a late takeover of an abandoned record leaves it abandoned, with the crashed attempt's fingerprint", async () => {
  vi.useFakeTimers();
  const shared = memoryStore({ now: () => Date.now() });
  const direct = createIdempotency({ store: shared, heartbeat: false, lease: '1s', now: () => Date.now() });
  // A crashed attempt: claimed, never settled, its lease ended.
  expect((await direct.begin(request)).kind).toBe('execute');
  await vi.advanceTimersByTimeAsync(1_500);
  // Only the takeover (a claim naming the abandoned record's token) waits.
  const { store, land } = queuedClaims(shared, (input) => input.replaces !== undefined);
  const engine = createIdempotency({ store, storeTimeout: '200ms', now: () => Date.now() });
  // Finds the record abandoned, then its takeover claim waits past storeTimeout.
  const refused = engine.begin(request);
  await vi.advanceTimersByTimeAsync(300);
  expect(await refused).toMatchObject({ kind: 'reject' });
  land();
  // (Its lease is ended at once: one millisecond, as a recovered run with no effect leaves it.)
  await vi.advanceTimersByTimeAsync(10);
  // Still abandoned under the crashed attempt's parameters: other parameters are refused, the same
  // request takes it over as a recovery.
  expect((await direct.begin({ ...request, fingerprint: 'b'.repeat(64) })).kind).toBe('reject');
  const retry = await direct.begin(request);
  expect(retry.kind === 'execute' && retry.lease.recovered).toBe(true);
});
