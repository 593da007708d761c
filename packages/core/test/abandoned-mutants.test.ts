import { afterEach, describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyOptions } from '../src/engine-options.js';
import type { IdempotencyEvent } from '../src/events.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store, StoredResponse } from '../src/store.js';

// Mutation tests of the engine's handling of abandoned records (a crashed attempt's lease ran out
// with nobody renewing it): each check fails on a mutant of engine.ts or memory-store.ts that the
// other tests let through, or records a defect (it.fails, with the reason).

const ok = (body = '{"ok":true}', status = 201): StoredResponse => ({
  status,
  headers: { 'content-type': 'application/json' },
  body: new TextEncoder().encode(body),
});

// A hex SHA-256, as the adapters pass: the engine stores it as given (other text it hashes first).
const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'a'.repeat(64) };

function setup(options: Partial<IdempotencyOptions> = {}, wrap: (store: Store) => Store = (store) => store) {
  const clock = { now: 1_700_000_000_000 };
  const inner = memoryStore({ now: () => clock.now });
  const store = wrap(inner);
  const events: IdempotencyEvent[] = [];
  const engine = createIdempotency({
    store,
    heartbeat: false,
    lease: '1s',
    now: () => clock.now,
    onEvent: (event) => events.push(event),
    ...options,
  });
  return { clock, inner, store, engine, events };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('a store that does not take the abandoned record over', () => {
  it('the 409 it gets is reported as a conflict event, after the one claim event of the crashed attempt', async () => {
    const { engine, events, clock } = setup({}, (inner) => ({
      ...inner,
      inProcess: true,
      claim: ({ replaces: _ignored, ...input }) => inner.claim(input),
    }));
    expect((await engine.begin(request)).kind).toBe('execute');
    clock.now += 1_000;
    const retry = await engine.begin(request);
    expect(retry.kind === 'reject' && [retry.error.code, retry.error.status]).toEqual(['in_progress', 409]);
    expect(events.map((event) => event.type)).toEqual(['claim', 'conflict']);
    expect(events.at(-1)).toMatchObject({ type: 'conflict', id: events[0]?.id, operation: 'POST /charges' });
  });
});

describe('a waiter that sees the record abandoned', () => {
  it('takes it over even when that poll lands at the end of its wait', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const crashing = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => Date.now() });
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store,
      lease: '1s',
      wait: '100ms',
      heartbeat: false,
      now: () => Date.now(),
      onEvent: (event) => events.push(event),
    });
    expect((await crashing.begin(request)).kind).toBe('execute');
    // The waiter's deadline is the crashed lease's end: its last poll, at the deadline, finds it
    // abandoned (the polls back off, 10, 20, 40 ms..., and stop early only while it is in progress).
    await vi.advanceTimersByTimeAsync(900);
    const waiting = engine.begin(request);
    await vi.advanceTimersByTimeAsync(300);
    const result = await waiting;
    expect(result.kind === 'execute' && result.lease.recovered).toBe(true);
    expect(events.map((event) => event.type)).toEqual(['claim']);
    expect(events[0]).toMatchObject({ recovered: true });
  });

  it('takes it over with the token it read: one claim, no claim without `replaces` first', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    const claims: (string | undefined)[] = [];
    const store: Store = {
      ...inner,
      claim: (input) => {
        claims.push(input.replaces);
        return inner.claim(input);
      },
    };
    const crashing = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', wait: '5s', heartbeat: false, now: () => Date.now() });
    const crashed = await crashing.begin(request);
    if (crashed.kind !== 'execute') throw new Error('expected execute');
    const waiting = engine.begin(request);
    await vi.advanceTimersByTimeAsync(1_300);
    const result = await waiting;
    expect(result.kind === 'execute' && result.lease.recovered).toBe(true);
    // The crashed claim, the waiter's first (answered in progress), then the takeover: the poll that
    // saw the record abandoned handed its token to the very next claim.
    expect(claims).toEqual([undefined, undefined, crashed.lease.token]);
  });

  it('that was only in progress when its wait ran short, then released, claims it fresh: not recovered', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const holder = createIdempotency({ store, lease: '10s', heartbeat: false, now: () => Date.now() });
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store,
      lease: '10s',
      wait: '100ms',
      heartbeat: false,
      now: () => Date.now(),
      onEvent: (event) => events.push(event),
    });
    const first = await holder.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    const waiting = engine.begin(request);
    // The waiter's first poll loop gives up near its deadline with the record in progress (70 ms);
    // the holder then lets go of the key (a 5xx it does not store), and the next poll sees it gone.
    await vi.advanceTimersByTimeAsync(75);
    expect(await holder.release(first.lease)).toEqual({ ok: true });
    await vi.advanceTimersByTimeAsync(100);
    const result = await waiting;
    expect(result.kind === 'execute' && result.lease.recovered).toBe(false);
    expect(events.map((event) => event.type)).toEqual(['claim']);
    expect(events[0]).not.toHaveProperty('recovered');
  });
});

describe('the fingerprint a taken-over record keeps', () => {
  it('is the takeover’s: a crash without a fingerprint, retried with one, then refuses other parameters', async () => {
    const { engine, clock } = setup();
    const crashed = await engine.begin({ ...request, fingerprint: '' });
    expect(crashed.kind === 'execute' && crashed.lease.recovered).toBe(false);
    clock.now += 1_000;
    const retry = await engine.begin(request);
    if (retry.kind !== 'execute') throw new Error('expected execute');
    expect(retry.lease.recovered).toBe(true);
    expect(await engine.complete(retry.lease, ok())).toEqual({ ok: true, stored: true });
    const other = await engine.begin({ ...request, fingerprint: 'fp-other' });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
    expect((await engine.begin(request)).kind).toBe('replay');
  });
});

describe('a store shared with other processes (not in this process): the local lease map', () => {
  const remote = (inner: Store): Store => ({ ...inner, inProcess: false });

  it('a key this process abandoned refuses other parameters here too, and the same ones take it over', async () => {
    const { engine, clock, events } = setup({}, remote);
    const crashed = await engine.begin(request);
    if (crashed.kind !== 'execute') throw new Error('expected execute');
    // Within its lease the local map answers 409 without the store.
    const busy = await engine.begin({ ...request, fingerprint: 'fp-other' });
    expect(busy.kind === 'reject' && busy.error.code).toBe('in_progress');
    clock.now += 1_000;
    const other = await engine.begin({ ...request, fingerprint: 'fp-other' });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
    const retry = await engine.begin(request);
    expect(retry.kind === 'execute' && retry.lease.recovered).toBe(true);
    expect(events.filter((event) => event.type === 'claim')).toEqual([
      expect.not.objectContaining({ recovered: true }),
      expect.objectContaining({ recovered: true }),
    ]);
    expect(await engine.complete(crashed.lease, ok('{"late":true}'))).toEqual({ ok: false, reason: 'lease-lost' });
  });
});

describe('the lease a takeover fences', () => {
  // The engine's heartbeat renews the leases in its `held` map. A takeover in the same process (after
  // a stall longer than a lease: a synchronous loop, a long GC pause) used to replace the old lease
  // there without marking it lost: no renewal of it ever ran again to find its token gone, so its
  // signal never aborted while the recovered execution ran beside it. A claim that takes a key over
  // from a lease of this process now marks that lease lost.
  it('the old holder in this process is told its lease is lost when a takeover lands', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now() });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    // A stall: the clock moves on, no timer runs, so no renewal is made.
    vi.setSystemTime(Date.now() + 1_500);
    const retry = await engine.begin(request);
    expect(retry.kind === 'execute' && retry.lease.recovered).toBe(true);
    expect(first.lease.lost).toBe(true);
    expect(first.lease.signal.aborted).toBe(true);
  });

  it('on a store other processes share too, where a stale lease of this process falls through to the store', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    const store: Store = { ...inner, inProcess: false };
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    vi.setSystemTime(Date.now() + 1_500);
    const retry = await engine.begin(request);
    expect(retry.kind === 'execute' && retry.lease.recovered).toBe(true);
    expect(first.lease.lost).toBe(true);
    expect(events.filter((e) => e.type === 'lease-lost')).toMatchObject([{ reason: 'taken-over' }]);
  });
});

describe('a recovered run that had no effect', () => {
  it("leaves the key abandoned with the crashed attempt's fingerprint: other parameters are still refused", async () => {
    let now = 0;
    const store = memoryStore({ now: () => now });
    const engine = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => now });
    expect((await engine.begin(request)).kind).toBe('execute'); // crashes
    now += 1_000;
    const recovered = await engine.begin(request);
    if (recovered.kind !== 'execute') throw new Error('expected execute');
    // A 5xx under storeOutcome 'success', a handler that called release(): the key is let go.
    expect(await engine.release(recovered.lease)).toEqual({ ok: true });
    now += 1;
    const other = await engine.begin({ ...request, fingerprint: 'other parameters' });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
    const again = await engine.begin(request);
    expect(again.kind === 'execute' && again.lease.recovered).toBe(true);
  });

  it('or whose outcome the store could not keep, leaves the key abandoned too', async () => {
    let now = 0;
    const inner = memoryStore({ now: () => now });
    let failing = false;
    const store: Store = {
      ...inner,
      complete: (input) => {
        if (failing) throw new Error('ECONNRESET');
        return inner.complete(input);
      },
    };
    const engine = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => now });
    expect((await engine.begin(request)).kind).toBe('execute'); // crashes
    now += 1_000;
    const recovered = await engine.begin(request);
    if (recovered.kind !== 'execute') throw new Error('expected execute');
    failing = true;
    expect(
      await engine.complete(recovered.lease, { status: 201, headers: {}, body: new Uint8Array([1]) }),
    ).toMatchObject({ ok: false, reason: 'store-error' });
    // The key is let go in the background.
    await new Promise((resolve) => setImmediate(resolve));
    now += 1;
    expect(await store.get(recovered.lease.id)).toMatchObject({ state: 'abandoned', fingerprint: request.fingerprint });
    const other = await engine.begin({ ...request, fingerprint: 'other parameters' });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
  });

  it('a first run that had no effect still frees the key for any parameters', async () => {
    const now = 0;
    const store = memoryStore({ now: () => now });
    const engine = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => now });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.release(first.lease);
    expect((await engine.begin({ ...request, fingerprint: 'other parameters' })).kind).toBe('execute');
  });
});

describe('a takeover by a request without a fingerprint', () => {
  it("keeps the crashed attempt's fingerprint, so its record refuses other parameters afterwards", async () => {
    let now = 0;
    const store = memoryStore({ now: () => now });
    const engine = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => now });
    expect((await engine.begin(request)).kind).toBe('execute'); // crashes
    now += 1_000;
    const recovered = await engine.begin({ ...request, fingerprint: '' });
    if (recovered.kind !== 'execute') throw new Error('expected execute');
    expect(recovered.lease.fingerprint).toBe(request.fingerprint);
    await engine.complete(recovered.lease, { status: 201, headers: {}, body: new Uint8Array([1]) });
    const other = await engine.begin({ ...request, fingerprint: 'other parameters' });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
  });
});

describe('a recovered run whose transaction fails in the store', () => {
  it('leaves the key abandoned, as it found it: other parameters are still refused, the same ones take it over', async () => {
    const { transactionalMemoryStore } = await import('@idem/testkit');
    const clock = { now: 1_700_000_000_000 };
    const inner = memoryStore({ now: () => clock.now });
    const failure = new Error('connection terminated');
    let commits = 0;
    const store = transactionalMemoryStore({
      store: inner,
      beforeCommit: () => {
        commits++;
        throw failure;
      },
    });
    const engine = createIdempotency({ store, heartbeat: false, lease: '1s', now: () => clock.now });
    expect((await engine.begin(request)).kind).toBe('execute');
    clock.now += 1_000;
    const retry = await engine.begin(request);
    if (retry.kind !== 'execute') throw new Error('expected execute');
    expect(retry.lease.recovered).toBe(true);
    const result = await engine.transaction(retry.lease, async () => ({ value: 1, response: ok() }));
    expect(result).toMatchObject({ committed: false, reason: 'store-error', error: failure });
    expect(commits).toBe(1);
    // Deleted instead, the record of the crashed attempt (which may have had effects) would let them
    // run. Let go, its lease ends a millisecond on.
    clock.now += 1;
    const other = await engine.begin({ ...request, fingerprint: 'fp-other' });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
    const again = await engine.begin(request);
    expect(again.kind === 'execute' && again.lease.recovered).toBe(true);
  });
});
