import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { BeginResult } from '../src/engine-types.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store, StoredResponse } from '../src/store.js';

// Audit (clocks): the engine's own clock (`now`, default `Date.now`) is a wall clock, which an NTP
// step, a VM resume or an operator's `date -s` moves by hours in one go. The engine measures
// intervals with it: when a lease is due for renewal, maxExecution, the wait deadline, the
// replay cache's ttl, and (with `Date.now` directly) storeTimeout. The store keeps its own clock
// (Redis PX, PostgreSQL clock_timestamp()), which does not step with the application server's.
//
// These tests run the engine with its default clock under fake timers: `vi.setSystemTime` is the
// NTP step (it moves `Date.now` only), `vi.advanceTimersByTimeAsync` is time that really passes
// (timers fire, `performance.now()` moves). The shared store's clock is the "server" clock below,
// which follows real elapsed time and never steps.

const HOUR = 3_600_000;
const T0 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

const ok = (body = '{"ok":true}', status = 201): StoredResponse => ({
  status,
  headers: { 'content-type': 'application/json' },
  body: new TextEncoder().encode(body),
});

const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'fp-a' };

// The store server's clock: real elapsed time since the test began, never stepped.
const serverClock = () => T0 + performance.now();

// A store other processes share (Redis, PostgreSQL), simulated by a memory store on the server's
// clock that does not say it is in this process (so the engine treats it as remote).
const sharedStore = (): Store => {
  const inner = memoryStore({ now: serverClock });
  return {
    claim: (input) => inner.claim(input),
    renew: (input) => inner.renew(input),
    complete: (input) => inner.complete(input),
    release: (input) => inner.release(input),
    get: (id) => inner.get(id),
  };
};

// Settles `promise` into a box so a test can look at whether it has settled without awaiting it.
const track = <T>(promise: Promise<T>) => {
  const box: { settled: boolean; value?: T; error?: unknown } = { settled: false };
  promise.then(
    (value) => {
      box.settled = true;
      box.value = value;
    },
    (error) => {
      box.settled = true;
      box.error = error;
    },
  );
  return box;
};

beforeEach(() => {
  vi.useFakeTimers({
    toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date', 'performance'],
    now: T0,
  });
});

afterEach(() => {
  vi.useRealTimers();
});

describe('the harness', () => {
  it('an NTP step moves Date.now but not performance.now or the timers', async () => {
    const wall = Date.now();
    const mono = performance.now();
    vi.setSystemTime(wall - HOUR);
    expect(Date.now()).toBe(wall - HOUR);
    expect(performance.now()).toBe(mono);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(Date.now()).toBe(wall - HOUR + 1_000);
    expect(performance.now()).toBe(mono + 1_000);
  });
});

describe('the heartbeat when the wall clock steps back', () => {
  // Was a defect: the heartbeat renews a lease when `now() - lastRenewedAt >= lease / 3` (engine.ts, tick), so after the wall clock steps back by an hour no lease of this process is renewed for an hour, the store (on its own clock) lets it expire after one lease, and another process takes the live execution over: two executions.
  it('keeps renewing a running lease, so another process cannot take the key over', async () => {
    const store = sharedStore();
    const a = createIdempotency({ store, lease: '1s' }); // process A: its server's clock will step
    const b = createIdempotency({ store, lease: '1s' }); // process B: the same store, another server
    const first = await a.begin(request);
    expect(first.kind).toBe('execute');

    vi.setSystemTime(Date.now() - HOUR); // NTP steps A's clock back one hour
    await vi.advanceTimersByTimeAsync(3_000); // A's handler is still running, 3 leases later

    if (first.kind === 'execute') expect(first.lease.lost).toBe(false);
    const retry = await b.begin(request);
    // A is alive and its handler still running: B must be refused, not run the operation again.
    expect(retry.kind).toBe('reject');
  });

  it('renews it when the wall clock stays put (the control)', async () => {
    const store = sharedStore();
    const a = createIdempotency({ store, lease: '1s' });
    const b = createIdempotency({ store, lease: '1s' });
    const first = await a.begin(request);
    expect(first.kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(3_000);
    const retry = await b.begin(request);
    expect(retry.kind).toBe('reject');
  });
});

describe('maxExecution when the wall clock jumps forward', () => {
  // Was a defect: maxExecution is checked as `now() - lease.startedAt >= maxExecutionMs` on the wall clock (engine.ts, tick), so a forward step (VM resume, NTP) larger than maxExecution aborts every running handler's signal and stops renewing its lease after a few milliseconds of real execution; another process then runs the operation beside it.
  it('does not give up on a handler that has run for 300 ms of a 1 min maxExecution', async () => {
    const store = sharedStore();
    const a = createIdempotency({ store, lease: '1s', maxExecution: '1m' });
    const b = createIdempotency({ store, lease: '1s' });
    const first = await a.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    const signal = first.lease.signal;

    vi.setSystemTime(Date.now() + 2 * HOUR); // the wall clock jumps forward two hours
    await vi.advanceTimersByTimeAsync(300);
    expect(signal.aborted).toBe(false);

    await vi.advanceTimersByTimeAsync(2_000); // 2.3 s into a handler allowed a minute
    const retry = await b.begin(request);
    expect(retry.kind).toBe('reject');
  });
});

describe('storeTimeout when the wall clock steps back', () => {
  // A store that never answers (a blackholed connection).
  const hungStore = (): Store => ({
    claim: () => new Promise(() => {}),
    renew: () => new Promise(() => {}),
    complete: () => new Promise(() => {}),
    release: () => new Promise(() => {}),
    get: () => new Promise(() => {}),
  });

  // Was a defect: store-call deadlines are `Date.now() + storeTimeout`, swept against Date.now (deadlines.ts, createDeadlines), so after the wall clock steps back by an hour a request on a hung store waits an hour instead of getting 503 after storeTimeout.
  it('answers 503 store_unavailable within about storeTimeout of real time', async () => {
    const engine = createIdempotency({ store: hungStore(), storeTimeout: '1s' });
    const started = track(engine.begin(request));
    await vi.advanceTimersByTimeAsync(10);
    vi.setSystemTime(Date.now() - HOUR);
    await vi.advanceTimersByTimeAsync(5_000); // five times storeTimeout really passes
    expect(started.settled).toBe(true);
    const result = started.value as BeginResult;
    expect(result.kind === 'reject' && result.error.code).toBe('store_unavailable');
  });

  // Was a defect: a forward step of the wall clock makes every store call in flight look overdue at the next sweep (deadlines.ts), so a claim a healthy store answers in 300 ms (storeTimeout 2 s) is answered 503, and the claim it sent still lands and holds the key in progress with no one running it.
  it('does not time out a call a healthy store answers in 300 ms when the wall clock jumps forward', async () => {
    const inner = sharedStore();
    const slowish: Store = {
      ...inner,
      claim: (input) => new Promise((resolve) => setTimeout(() => resolve(inner.claim(input)), 300)),
    };
    const engine = createIdempotency({ store: slowish, storeTimeout: '2s' });
    const started = track(engine.begin(request));
    await vi.advanceTimersByTimeAsync(1);
    vi.setSystemTime(Date.now() + HOUR);
    await vi.advanceTimersByTimeAsync(400);
    expect(started.settled).toBe(true);
    expect((started.value as BeginResult).kind).toBe('execute');
  });
});

describe('wait when the wall clock steps back', () => {
  // Was a defect: the wait deadline is `now() + wait` checked against the wall clock (engine.ts, begin and waitForOutcome), so a request waiting on a key in progress elsewhere polls for an hour after the clock steps back by an hour, instead of answering 409 after `wait`.
  it('answers 409 after about `wait` of real time', async () => {
    const store = sharedStore();
    const a = createIdempotency({ store, lease: '10s' });
    const b = createIdempotency({ store, lease: '10s', wait: '2s' });
    const first = await a.begin(request);
    expect(first.kind).toBe('execute');
    const waiting = track(b.begin(request));
    await vi.advanceTimersByTimeAsync(100);
    vi.setSystemTime(Date.now() - HOUR);
    await vi.advanceTimersByTimeAsync(8_000); // four times `wait`; A still runs (its heartbeat renews)
    expect(waiting.settled).toBe(true);
    const result = waiting.value as BeginResult;
    expect(result.kind === 'reject' && result.error.code).toBe('in_progress');
  });
});

describe('replayCache when the wall clock steps back', () => {
  // Was a defect: a cached outcome is good `until: now() + ttl` on the wall clock (replay-cache.ts, used by engine.ts begin), so after a step back of an hour it is replayed for an hour after the store forgot it (docs/stores.md promises "up to `ttl`"), and a key whose retention ended never runs again meanwhile.
  it('stops replaying a record the store forgot within the cache ttl of real time', async () => {
    const store = sharedStore();
    const engine = createIdempotency({
      store,
      retention: '2s',
      acknowledgeShortRetention: true,
      replayCache: { ttl: '1s' },
    });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    expect((await engine.complete(first.lease, ok())).ok).toBe(true);

    vi.setSystemTime(Date.now() - HOUR);
    await vi.advanceTimersByTimeAsync(5_000); // the store's retention (2 s) and the cache's ttl (1 s) have passed
    expect(await store.get(first.lease.id)).toBeUndefined(); // the store has forgotten it

    const again = await engine.begin(request);
    expect(again.kind).toBe('execute');
  });
});

describe('the memory store when the wall clock steps', () => {
  // Was a defect: the memory store timed leases on Date.now, so a forward step longer than the lease
  // ended every live lease at once and a retry ran beside the handler still running.
  it('keeps a live lease live across a forward step of an hour', async () => {
    const store = memoryStore();
    expect(store.claim({ id: 'r', token: 'a', fingerprint: 'fp', leaseMs: 10_000 })).toEqual({ claimed: true });
    vi.setSystemTime(Date.now() + HOUR);
    expect(store.claim({ id: 'r', token: 'b', fingerprint: 'fp', leaseMs: 10_000 })).toMatchObject({ claimed: false });
    await vi.advanceTimersByTimeAsync(10_001);
    expect(store.claim({ id: 'r', token: 'c', fingerprint: 'fp', leaseMs: 10_000 })).toEqual({ claimed: true });
  });
});
