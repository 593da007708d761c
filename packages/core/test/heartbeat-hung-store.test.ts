// The lease's signal and `lease-lost` when the store hangs instead of failing (operations day two): a
// paused Redis, a PostgreSQL renewal stuck behind a lock, or a network path that drops packets from
// this worker only, while other workers still reach the store. docs/reliability.md and the adapter
// guides promise that the signal aborts when a renewal is "refused or impossible for a whole lease",
// so that "a handler that checks it before its write stops there" and "cannot make the effect twice".
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyEvent } from '../src/events.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';

afterEach(() => {
  vi.useRealTimers();
});

const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'fp-a' };

// The memory store as a store behind a network (not in process, so `storeTimeout` applies), whose
// renewals from this worker never answer once `cut` is set.
function partitioned(inner: Store) {
  const link = { cut: false };
  const store: Store = {
    claim: (input) => Promise.resolve(inner.claim(input)),
    renew: (input) => (link.cut ? new Promise<boolean>(() => {}) : Promise.resolve(inner.renew(input))),
    complete: (input) => Promise.resolve(inner.complete(input)),
    release: (input) => Promise.resolve(inner.release(input)),
    get: (id) => Promise.resolve(inner.get(id)),
  };
  return { store, link };
}

// The heartbeat used to judge "impossible for a whole lease" only when a renewal attempt ended, so a
// renewal that hung kept the signal quiet for as long as storeTimeout let it hang: until 12 s with
// the defaults (lease 10 s), 25 s with a 15 s storeTimeout, while another worker's retry had run
// beside the handler since 10 s. Now the lease's end is one lease after the last confirmed renewal
// was sent, whatever is still in flight; the heartbeat keeps trying (see the slow-store scenario in
// testkit's reliability tests: a slow link still renews, and nobody else runs).
const hungCases = [
  ['the default storeTimeout (2 s)', undefined, 0],
  ['a storeTimeout longer than the lease (15 s)', '15s', 0],
  // A busy server: the heartbeat already ticks for other requests, so this claim falls between
  // two ticks and its lease ends between them too.
  ['a claim between two heartbeat ticks', undefined, 1_300],
] as const;

// Both heartbeats: the shared one and a timer per lease (`'per-lease'`, the default on Workers).
describe.each([true, 'per-lease'] as const)('a store that hangs on renewals (heartbeat: %s)', (heartbeat) => {
  for (const [name, storeTimeout, earlierClaimMs] of hungCases) {
    it(`aborts the signal once the lease ended, before another worker can take the key over, with ${name}`, async () => {
      vi.useFakeTimers();
      const shared = memoryStore({ now: () => Date.now() });
      const { store, link } = partitioned(shared);
      const events: IdempotencyEvent[] = [];
      const worker = createIdempotency({
        store,
        lease: '10s',
        heartbeat,
        now: () => Date.now(),
        onEvent: (event) => events.push(event),
        ...(storeTimeout === undefined ? {} : { storeTimeout }),
      });
      const other = createIdempotency({ store: shared, heartbeat: false, now: () => Date.now() });

      if (earlierClaimMs > 0) {
        expect((await worker.begin({ ...request, key: 'k-earlier' })).kind).toBe('execute');
        await vi.advanceTimersByTimeAsync(earlierClaimMs);
      }
      const first = await worker.begin(request);
      if (first.kind !== 'execute') throw new Error('expected execute');
      link.cut = true;
      // Within the lease the key is held, and nothing is lost yet.
      await vi.advanceTimersByTimeAsync(9_000);
      expect(first.lease.signal.aborted).toBe(false);
      expect((await other.begin(request)).kind).toBe('reject');

      // One lease after the last renewal the store lets the retry in, on another worker.
      await vi.advanceTimersByTimeAsync(1_000);
      const retry = await other.begin(request);
      expect(retry.kind).toBe('execute');
      // The first worker's handler, checking its signal before its effect, must see the loss by now.
      expect(first.lease.signal.aborted).toBe(true);
      expect(first.lease.lost).toBe(true);
      expect(events.filter((event) => event.type === 'lease-lost' && event.id === first.lease.id)).toEqual([
        expect.objectContaining({ reason: 'renew-failed', operation: 'POST /charges' }),
      ]);
    });
  }
});

// docs/operations.md, "What to alert on", lease-lost: what a lost lease leaves depends on whether
// another execution took the key over. Nobody did here: the store came back before any retry.
describe('a lease lost to a store outage that nobody took over', () => {
  it('still stores the outcome when the handler answers, and retries replay it', async () => {
    vi.useFakeTimers();
    const shared = memoryStore({ now: () => Date.now() });
    const { store, link } = partitioned(shared);
    const events: IdempotencyEvent[] = [];
    const worker = createIdempotency({ store, lease: '10s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const first = await worker.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    link.cut = true;
    await vi.advanceTimersByTimeAsync(12_000);
    expect(first.lease.lost).toBe(true);
    link.cut = false;
    const body = new TextEncoder().encode('{"id":"ch_1"}');
    expect(await worker.complete(first.lease, { status: 201, headers: {}, body })).toEqual({ ok: true, stored: true });
    // (Each renewal that timed out is a store-error of phase renew.)
    expect(events.filter((event) => event.type !== 'store-error').map((event) => event.type)).toEqual([
      'claim',
      'lease-lost',
      'complete',
    ]);
    const retry = await worker.begin(request);
    expect(retry.kind === 'replay' && retry.response.status).toBe(201);
  });
});

// A stalled event loop (a long GC pause, a VM paused) is the other way a lease outlives itself: no
// tick ran, and no renewal hangs. Then the store can tell: if nobody took the key over, the holder
// still holds its token and the renewal succeeds (concepts.md: "if it was only stalled and answers
// before that, its outcome is stored").
describe('a lease whose process stalled past it', () => {
  it('asks the store: renewed when nobody took the key over, lost when somebody did', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const events: IdempotencyEvent[] = [];
    const worker = createIdempotency({ store, lease: '10s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const other = createIdempotency({ store, heartbeat: false, now: () => Date.now() });

    const stalled = await worker.begin(request);
    if (stalled.kind !== 'execute') throw new Error('expected execute');
    // Twelve seconds pass with no timer run, then the loop wakes up.
    vi.setSystemTime(Date.now() + 12_000);
    await vi.advanceTimersByTimeAsync(2_500);
    expect(stalled.lease.lost).toBe(false);
    expect(events.some((event) => event.type === 'lease-lost')).toBe(false);
    // Renewed: the key is held again.
    expect((await other.begin(request)).kind).toBe('reject');

    const taken = await worker.begin({ ...request, key: 'k-2' });
    if (taken.kind !== 'execute') throw new Error('expected execute');
    vi.setSystemTime(Date.now() + 12_000);
    // Another worker takes the abandoned key over during the stall.
    expect((await other.begin({ ...request, key: 'k-2' })).kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(2_500);
    expect(taken.lease.lost).toBe(true);
    expect(taken.lease.signal.aborted).toBe(true);
  });
});

// The same stall with a store behind a network: another worker could have taken the key over in
// the stall, and the handler's next step may come before the renewal's answer, so the signal
// aborts at once. The heartbeat still asks the store, and when nobody took the key over it is held
// again: a handler that carries on has its outcome stored, and nobody else runs meanwhile.
describe('a lease whose process stalled past it, on a store behind a network', () => {
  it('aborts the signal at once, keeps the key held when the store renews it, and stores the outcome', async () => {
    vi.useFakeTimers();
    const shared = memoryStore({ now: () => Date.now() });
    const { store } = partitioned(shared);
    const events: IdempotencyEvent[] = [];
    const worker = createIdempotency({ store, lease: '10s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const other = createIdempotency({ store: shared, heartbeat: false, now: () => Date.now() });

    const stalled = await worker.begin(request);
    if (stalled.kind !== 'execute') throw new Error('expected execute');
    vi.setSystemTime(Date.now() + 12_000);
    await vi.advanceTimersByTimeAsync(2_500);
    expect(stalled.lease.signal.aborted).toBe(true);
    expect(events.filter((event) => event.type === 'lease-lost')).toEqual([
      expect.objectContaining({ reason: 'renew-failed' }),
    ]);
    // Renewed all the same: the key is held, and stays held while the handler carries on.
    expect((await other.begin(request)).kind).toBe('reject');
    await vi.advanceTimersByTimeAsync(30_000);
    expect((await other.begin(request)).kind).toBe('reject');
    const body = new TextEncoder().encode('{"id":"ch_1"}');
    expect(await worker.complete(stalled.lease, { status: 201, headers: {}, body })).toEqual({
      ok: true,
      stored: true,
    });
    const retry = await other.begin(request);
    expect(retry.kind === 'replay' && retry.response.status).toBe(201);
  });

  it('stops renewing once a renewal is refused: the key was taken over in the stall', async () => {
    vi.useFakeTimers();
    const shared = memoryStore({ now: () => Date.now() });
    const { store } = partitioned(shared);
    const renewals: number[] = [];
    const counted: Store = {
      ...store,
      renew: (input) => {
        renewals.push(Date.now());
        return store.renew(input);
      },
    };
    const worker = createIdempotency({ store: counted, lease: '10s', now: () => Date.now() });
    const other = createIdempotency({ store: shared, heartbeat: false, now: () => Date.now() });

    const stalled = await worker.begin(request);
    if (stalled.kind !== 'execute') throw new Error('expected execute');
    vi.setSystemTime(Date.now() + 12_000);
    expect((await other.begin(request)).kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(2_500);
    expect(stalled.lease.lost).toBe(true);
    const sent = renewals.length;
    expect(sent).toBeGreaterThan(0);
    await vi.advanceTimersByTimeAsync(30_000);
    expect(renewals.length).toBe(sent);
  });
});
