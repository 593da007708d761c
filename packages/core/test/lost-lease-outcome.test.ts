// What is stored when a handler stops because its lease was lost. The adapter guides say: pass
// `signal` to the call that makes the effect, or check it first, and "a handler that stops there
// cannot make the effect twice"; concepts.md says that after `maxExecution` "a retry runs once the
// store lets the lease go". A handler that obeys stops with the signal's error, which the adapters
// report as a thrown 500.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyEvent } from '../src/events.js';
import { memoryStore } from '../src/memory-store.js';
import type { StoredResponse } from '../src/store.js';

afterEach(() => {
  vi.useRealTimers();
});

const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'fp-a' };

const thrown500: StoredResponse = {
  status: 500,
  headers: { 'content-type': 'application/problem+json' },
  body: new TextEncoder().encode('{"title":"Internal Server Error"}'),
};

describe('a handler that stopped on its lost lease', () => {
  // Was a defect: the engine stored the outcome of a lease it had itself marked lost as long as nobody
  // took the key over, whatever that outcome was. So the handler that did what the guides ask (it
  // stopped before its effect when the signal aborted, with maxExecution or a store outage) had its
  // abort error stored as a 500 under the default policy ('all' keeps thrown errors), and every
  // retry for the whole retention got that 500 replayed: the operation never ran, though nothing
  // ran. Now a thrown outcome of a lost lease is settled as a crash: the lease ends at once, the
  // record stays abandoned with this attempt's fingerprint, and the same request takes it over.
  it('is not pinned as the outcome: a retry runs once the lease is gone', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store,
      lease: '1s',
      maxExecution: '3s',
      now: () => Date.now(),
      onEvent: (event) => events.push(event),
    });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(3_500);
    expect(first.lease.signal.aborted).toBe(true);
    // The handler stops before its effect; the adapter settles the thrown error as a 500.
    await engine.complete(first.lease, thrown500, { status: 500, thrown: true });
    // Within one lease more the store has let the lease go, and the client's retry runs the charge.
    await vi.advanceTimersByTimeAsync(1_000);
    // Other parameters under the key are still refused: the stopped attempt may have done part of its work.
    const other = await engine.begin({ ...request, fingerprint: 'fp-b' });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
    const retry = await engine.begin(request);
    expect(retry.kind).toBe('execute');
    if (retry.kind === 'execute') expect(retry.lease.recovered).toBe(true);
    expect(events.filter((event) => event.type === 'not-stored')).toHaveLength(1);
    expect(events.some((event) => event.type === 'complete')).toBe(false);
    // As docs/operations.md's event table says: `lease-lost` first, then `not-stored`, and no
    // `release` (the key is not released: it stays for the same request to take over).
    const settled = events
      .filter((event) => event.id === first.lease.id && event.type !== 'store-error')
      .map((event) => event.type);
    expect(settled.slice(0, settled.indexOf('not-stored') + 1)).toEqual(['claim', 'lease-lost', 'not-stored']);
  });

  it('a throw after another execution took the key over is fenced: its record and answer stay', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', maxExecution: '3s', now: () => Date.now() });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(4_500);
    // The lease has ended at the store: another server's retry takes the key over and answers.
    const other = createIdempotency({ store, heartbeat: false, now: () => Date.now() });
    const retry = await other.begin(request);
    if (retry.kind !== 'execute') throw new Error('expected the retry to execute');
    const created: StoredResponse = { status: 201, headers: {}, body: new TextEncoder().encode('{"id":"ch_1"}') };
    await other.complete(retry.lease, created);
    // The first handler, stopped on its signal, throws now: refused, nothing of its own kept.
    expect(await engine.complete(first.lease, thrown500, { status: 500, thrown: true })).toEqual({
      ok: false,
      reason: 'lease-lost',
    });
    expect(await store.get(first.lease.id)).toMatchObject({ state: 'completed', response: { status: 201 } });
  });

  it('an answer that still comes after the loss, nobody having taken the key over, is stored as before', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', maxExecution: '3s', now: () => Date.now() });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(3_500);
    const created: StoredResponse = { status: 201, headers: {}, body: new TextEncoder().encode('{"id":"ch_1"}') };
    expect(await engine.complete(first.lease, created, { status: 201 })).toEqual({ ok: true, stored: true });
    expect((await engine.begin(request)).kind).toBe('replay');
  });
});
