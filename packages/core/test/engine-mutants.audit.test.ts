import { afterEach, describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyEvent } from '../src/events.js';
import { type MemoryStore, memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';

// Mutation tests of engine.ts: each check fails on a mutant of a line that carries a decision and
// that the other tests let through.

// A hex SHA-256, as the adapters pass: the engine stores it as given (other text it hashes first).
const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'a'.repeat(64) };
const response = { status: 201, headers: {}, body: new Uint8Array([1]) };

afterEach(() => {
  vi.useRealTimers();
});

describe('a waiter without a fingerprint that sees the record abandoned while it waits', () => {
  it("takes it over keeping the crashed attempt's fingerprint, so other parameters are still refused", async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const crashing = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', wait: '5s', heartbeat: false, now: () => Date.now() });
    expect((await crashing.begin(request)).kind).toBe('execute'); // crashes
    // Its claim finds the key in progress; a poll while it waits finds it abandoned (the claim path
    // that meets an abandoned record at once is another line).
    const waiting = engine.begin({ ...request, fingerprint: '' });
    await vi.advanceTimersByTimeAsync(1_300);
    const recovered = await waiting;
    if (recovered.kind !== 'execute') throw new Error('expected execute');
    expect(recovered.lease.recovered).toBe(true);
    expect(recovered.lease.fingerprint).toBe(request.fingerprint);
    await engine.complete(recovered.lease, { status: 201, headers: {}, body: new Uint8Array([1]) });
    const other = await engine.begin({ ...request, fingerprint: 'b'.repeat(64) });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
  });
});

// The memory store behind a network (answers as promises), whose completions fail as told.
function flakyCompletions(inner: Store, fail: (call: number) => boolean) {
  const calls = { complete: 0, release: 0 };
  const store: Store = {
    claim: (input) => Promise.resolve(inner.claim(input)),
    renew: (input) => Promise.resolve(inner.renew(input)),
    complete: (input) =>
      fail(++calls.complete) ? Promise.reject(new Error('connection reset')) : Promise.resolve(inner.complete(input)),
    release: (input) => {
      calls.release++;
      return Promise.resolve(inner.release(input));
    },
    get: (id) => Promise.resolve(inner.get(id)),
  };
  return { store, calls };
}

describe('a completion that keeps failing in the store', () => {
  it('is tried again five times (100 ms to 1.6 s apart), then the key is freed', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    const { store, calls } = flakyCompletions(inner, () => true);
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, now: () => Date.now(), onEvent: (event) => events.push(event) });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    expect(await engine.complete(started.lease, response)).toMatchObject({ ok: false, reason: 'store-error' });
    await vi.advanceTimersByTimeAsync(100 + 200 + 400 + 800 + 1_600 - 1);
    expect([calls.complete, calls.release]).toEqual([5, 0]);
    await vi.advanceTimersByTimeAsync(1);
    expect([calls.complete, calls.release]).toEqual([6, 1]);
    // No seventh attempt, however long one waits: the key is free for a retry.
    await vi.advanceTimersByTimeAsync(10_000);
    expect(calls.complete).toBe(6);
    expect(events.filter((event) => event.type === 'store-error')).toHaveLength(6);
    expect(inner.get(started.lease.id)).toBeUndefined();
  });
});

describe('a retried completion the store refuses', () => {
  it('is fenced when the record was completed under another claim’s token meanwhile', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    const { store } = flakyCompletions(inner, (call) => call === 1);
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store,
      lease: '1s',
      heartbeat: false,
      now: () => Date.now(),
      onEvent: (event) => events.push(event),
    });
    const other = createIdempotency({ store: inner, lease: '1s', heartbeat: false, now: () => Date.now() });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    // It stalls past its lease; a retry elsewhere takes the key over and completes it.
    await vi.advanceTimersByTimeAsync(1_200);
    const second = await other.begin(request);
    if (second.kind !== 'execute') throw new Error('expected the takeover to execute');
    await other.complete(second.lease, { ...response, body: new Uint8Array([2]) });
    // The stalled run's completion fails once, and its retry is refused: the record is the other's.
    expect(await engine.complete(first.lease, response)).toMatchObject({ ok: false, reason: 'store-error' });
    await vi.advanceTimersByTimeAsync(200);
    expect(first.lease.lost).toBe(true);
    expect(events.filter((event) => event.type === 'complete')).toEqual([]);
    expect(events.at(-1)).toMatchObject({ type: 'lease-lost', reason: 'fenced' });
    expect(inner.get(first.lease.id)).toMatchObject({ state: 'completed', token: second.lease.token });
  });
});

describe('a waiter whose key stays in progress', () => {
  it('gets its 409 at its deadline, not a poll past it', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const holder = createIdempotency({ store, heartbeat: false, now: () => Date.now() });
    const engine = createIdempotency({ store, wait: '100ms', heartbeat: false, now: () => Date.now() });
    expect((await holder.begin(request)).kind).toBe('execute');
    let settled = false;
    const waiting = engine.begin(request).finally(() => {
      settled = true;
    });
    // Polls at 10, 30 and 70 ms; the next, 80 ms later, would land past the deadline: it stops there.
    await vi.advanceTimersByTimeAsync(100);
    expect(settled).toBe(true);
    const result = await waiting;
    expect(result.kind === 'reject' && result.error.code).toBe('in_progress');
  });
});

// A store behind a network (not in this process), over the memory store; renewals answer as told.
function remoteRenewals(inner: MemoryStore) {
  const link = { renew: (answer: boolean) => Promise.resolve(answer) as Promise<boolean> };
  const store: Store = {
    claim: (input) => Promise.resolve(inner.claim(input)),
    // (The memory store answers synchronously.)
    renew: (input) => link.renew(inner.renew(input) as boolean),
    complete: (input) => Promise.resolve(inner.complete(input)),
    release: (input) => Promise.resolve(inner.release(input)),
    get: (id) => Promise.resolve(inner.get(id)),
  };
  return { store, link };
}

describe('the heartbeat of a store behind a network', () => {
  const hang = () => new Promise<boolean>(() => {});

  function lostAt(events: IdempotencyEvent[]) {
    return events.filter((event) => event.type === 'lease-lost').map((event) => [event.reason, event.at]);
  }

  it('marks a lease whose renewals hang lost at its very end, when the store would let it go', async () => {
    vi.useFakeTimers({ now: 0 });
    const inner = memoryStore({ now: () => Date.now() });
    const { store, link } = remoteRenewals(inner);
    link.renew = hang;
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    // Ticks every 250 ms: the one at 1000 ms is the lease's end (the memory store's lease ends there).
    await vi.advanceTimersByTimeAsync(1_000);
    expect(started.lease.lost).toBe(true);
    expect(lostAt(events)).toEqual([['renew-failed', 1_000]]);
  });

  it('wakes up at the end of a lease that falls between two ticks', async () => {
    vi.useFakeTimers({ now: 0 });
    const inner = memoryStore({ now: () => Date.now() });
    const { store, link } = remoteRenewals(inner);
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    // A first lease starts the heartbeat (ticks at 250, 500, 750...); the second is claimed 100 ms in.
    expect((await engine.begin({ ...request, key: 'k-0' })).kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(100);
    link.renew = hang;
    const second = await engine.begin(request);
    if (second.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(second.lease.lost).toBe(true);
    // At 1100 ms, its end, not at the tick after it (1250 ms).
    expect(lostAt(events)).toContainEqual(['renew-failed', 1_100]);
  });

  it('counts a renewal from when it was sent, not from its answer', async () => {
    vi.useFakeTimers({ now: 0 });
    const inner = memoryStore({ now: () => Date.now() });
    const { store, link } = remoteRenewals(inner);
    // The first renewal (sent at 500 ms, a third of the lease having passed at the tick) is
    // answered 400 ms later; every later one hangs.
    let renewals = 0;
    link.renew = (answer) =>
      ++renewals === 1 ? new Promise((resolve) => setTimeout(() => resolve(answer), 400)) : hang();
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(1_499);
    expect(started.lease.lost).toBe(false);
    // The store set that lease at 500 ms at the latest: it ends by 1500 ms, not 1900 ms.
    await vi.advanceTimersByTimeAsync(1);
    expect(lostAt(events)).toEqual([['renew-failed', 1_500]]);
  });

  it('renews a lease at the tick a third of a lease after its last renewal, not a tick later', async () => {
    vi.useFakeTimers({ now: 0 });
    const inner = memoryStore({ now: () => Date.now() });
    const { store, link } = remoteRenewals(inner);
    const renewedAt: number[] = [];
    link.renew = (answer) => {
      renewedAt.push(Date.now());
      return Promise.resolve(answer);
    };
    const engine = createIdempotency({ store, lease: '3s', now: () => Date.now() });
    // The first lease starts the heartbeat (a tick every 750 ms); the second is claimed at 500 ms, so
    // the tick at 1500 ms finds it renewed exactly a third of its lease (1 s) ago.
    expect((await engine.begin({ ...request, key: 'k-0' })).kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(500);
    expect((await engine.begin(request)).kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(1_000);
    // At 750 ms the first lease (a third of 3 s is 1 s) is not due yet; at 1500 ms both are.
    expect(renewedAt).toEqual([1_500, 1_500]);
  });

  it('gives a handler up at maxExecution exactly', async () => {
    vi.useFakeTimers({ now: 0 });
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: memoryStore({ now: () => Date.now() }),
      lease: '1s',
      maxExecution: '1s',
      now: () => Date.now(),
      onEvent: (e) => events.push(e),
    });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(999);
    expect(started.lease.lost).toBe(false);
    await vi.advanceTimersByTimeAsync(1);
    expect(lostAt(events)).toEqual([['max-execution', 1_000]]);
  });
});
