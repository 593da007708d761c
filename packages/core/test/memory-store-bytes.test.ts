import { Buffer } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import { createIdempotency, isResponseTooLargeError, memoryStore } from '../src/index.js';

// memoryStore's byte budget: records were bounded by count only, so 100,000 records (the default) of
// 1 MiB responses (the HTTP layer's default cap) could hold 100 GiB in one process.

const retentionMs = 60_000;
const leaseMs = 10_000;

const response = (bytes: number, headers: Record<string, string> = {}) => ({
  status: 201,
  headers,
  body: Buffer.alloc(bytes, 0x61),
});

describe('memoryStore maxBytes', () => {
  it('makes room by the bytes it holds: the completed record nearest its end goes, reported', async () => {
    let now = 0;
    const evictions: string[] = [];
    const store = memoryStore({ maxBytes: 10_000, now: () => now, onEvict: ({ id }) => evictions.push(id) });
    for (const id of ['a', 'b', 'c']) {
      expect(store.claim({ id, token: `t-${id}`, fingerprint: 'f', leaseMs })).toEqual({ claimed: true });
      expect(store.complete({ id, token: `t-${id}`, response: response(3_000), retentionMs })).toBe(true);
      now += 1;
    }
    expect(store.size).toBe(3);
    expect(evictions).toEqual([]);
    // A fourth 3,000-byte record takes the total over 10,000: the oldest goes.
    store.claim({ id: 'd', token: 't-d', fingerprint: 'f', leaseMs });
    expect(store.complete({ id: 'd', token: 't-d', response: response(3_000), retentionMs })).toBe(true);
    expect(evictions).toEqual(['a']);
    expect(store.evicted).toBe(1);
    expect(store.get('a')).toBeUndefined();
    expect((await store.get('d'))?.state).toBe('completed');
    expect(store.bytes).toBeLessThanOrEqual(10_000);
  });

  it('counts headers as well as bodies', () => {
    const evictions: string[] = [];
    const store = memoryStore({ maxBytes: 10_000, now: () => 0, onEvict: ({ id }) => evictions.push(id) });
    const big = { link: 'x'.repeat(4_000) };
    for (const id of ['a', 'b', 'c']) {
      store.claim({ id, token: `t-${id}`, fingerprint: 'f', leaseMs });
      store.complete({
        id,
        token: `t-${id}`,
        response: response(10, big),
        retentionMs: retentionMs + id.charCodeAt(0),
      });
    }
    expect(evictions).toEqual(['a']);
  });

  it('never drops a live lease to make room, and gives the bytes back as records go', async () => {
    let now = 0;
    const store = memoryStore({ maxBytes: 5_000, now: () => now });
    store.claim({ id: 'live', token: 't', fingerprint: 'f'.repeat(64), leaseMs });
    store.claim({ id: 'done', token: 't2', fingerprint: 'f', leaseMs });
    store.complete({ id: 'done', token: 't2', response: response(4_000), retentionMs: 1_000 });
    store.claim({ id: 'more', token: 't3', fingerprint: 'f', leaseMs });
    store.complete({ id: 'more', token: 't3', response: response(4_000), retentionMs: 2_000 });
    expect((await store.get('live'))?.state).toBe('in_progress');
    expect(store.get('done')).toBeUndefined();
    const held = store.bytes;
    expect(held).toBeGreaterThan(4_000);
    expect(store.release({ id: 'live', token: 't' })).toBe(true);
    expect(store.bytes).toBeLessThan(held);
    now += retentionMs;
    expect(store.get('more')).toBeUndefined();
    // Expired and released records hold nothing.
    expect(store.bytes).toBe(0);
  });

  it('makes room when a takeover grows a record past the budget', async () => {
    let t = 0;
    const evictions: string[] = [];
    const store = memoryStore({ maxBytes: 2_000, now: () => t, onEvict: ({ id }) => evictions.push(id) });
    store.claim({ id: 'done', token: 't1', fingerprint: 'f', leaseMs });
    store.complete({ id: 'done', token: 't1', response: response(1_000), retentionMs });
    store.claim({ id: 'crashed', token: 't2', fingerprint: 'f', leaseMs: 10, keepAfterLeaseMs: retentionMs * 2 });
    t = 20;
    // Taken over with a fingerprint of 1,500 characters (a direct caller's; the engine's are 64).
    const taken = store.claim({ id: 'crashed', token: 't3', fingerprint: 'f'.repeat(1_500), leaseMs, replaces: 't2' });
    expect(taken).toEqual({ claimed: true });
    expect(store.bytes).toBeLessThanOrEqual(2_000);
    expect(evictions).toEqual(['done']);
  });

  it('refuses, before it writes anything, one response over the whole budget', async () => {
    const store = memoryStore({ maxBytes: 1_000, now: () => 0 });
    store.claim({ id: 'a', token: 't', fingerprint: 'f', leaseMs });
    let thrown: unknown;
    try {
      store.complete({ id: 'a', token: 't', response: response(2_000), retentionMs });
    } catch (error) {
      thrown = error;
    }
    expect(isResponseTooLargeError(thrown)).toBe(true);
    expect((await store.get('a'))?.state).toBe('in_progress');
  });

  it('has a default budget of 256 MiB and refuses a budget that is no positive integer', () => {
    const store = memoryStore({ now: () => 0 });
    store.claim({ id: 'a', token: 't', fingerprint: 'f', leaseMs });
    // (A zeroed Uint8Array: the pages are not touched, so the test costs no 256 MiB.)
    const huge = { status: 201, headers: {}, body: new Uint8Array(256 * 1024 * 1024) };
    expect(() => store.complete({ id: 'a', token: 't', response: huge, retentionMs })).toThrow(/268435456/);
    for (const bad of [0, -1, 1.5, Number.NaN, '1000' as unknown as number]) {
      expect(() => memoryStore({ maxBytes: bad })).toThrow(TypeError);
    }
  });

  it('through the engine: a response over the budget is not stored and the key is free again', async () => {
    const events: string[] = [];
    const store = memoryStore({ maxBytes: 1_000 });
    const engine = createIdempotency({ store, onEvent: (event) => events.push(event.type) });
    const begun = await engine.begin({ key: 'k', scope: 's', operation: 'POST /x', fingerprint: '' });
    expect(begun.kind).toBe('execute');
    if (begun.kind !== 'execute') return;
    const result = await engine.complete(begun.lease, response(2_000));
    expect(result.ok).toBe(false);
    expect(events).toContain('store-error');
    const again = await engine.begin({ key: 'k', scope: 's', operation: 'POST /x', fingerprint: '' });
    expect(again.kind).toBe('execute');
  });
});
