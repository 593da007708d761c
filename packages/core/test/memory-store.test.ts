import { describeStore } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import { memoryStore } from '../src/memory-store.js';

describe('memoryStore', () => {
  describeStore('memoryStore', async () => {
    let now = 1_000_000;
    const store = memoryStore({ now: () => now, maxEntries: 100_000 });
    // The memory store has one clock for all records: moving it past any lease or retention
    // expires the record under test exactly as time passing would.
    return {
      store,
      expire: async () => {
        now += 400 * 86_400_000;
      },
    };
  });

  it('expires a lease at exactly leaseMs on its clock', async () => {
    let now = 0;
    const store = memoryStore({ now: () => now });
    await store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 });
    now = 999;
    expect((await store.claim({ id: 'a', token: 'u', fingerprint: '', leaseMs: 1_000 })).claimed).toBe(false);
    now = 1_000;
    expect((await store.claim({ id: 'a', token: 'u', fingerprint: '', leaseMs: 1_000 })).claimed).toBe(true);
  });

  it('never evicts records in progress, and evicts the oldest completed ones first when full', async () => {
    const store = memoryStore({ maxEntries: 3, now: () => 0 });
    const done = { status: 200, headers: {}, body: new Uint8Array() };
    await store.claim({ id: 'old', token: 't', fingerprint: '', leaseMs: 1_000 });
    await store.complete({ id: 'old', token: 't', response: done, retentionMs: 10_000 });
    await store.claim({ id: 'p1', token: 't', fingerprint: '', leaseMs: 1_000 });
    await store.claim({ id: 'p2', token: 't', fingerprint: '', leaseMs: 1_000 });
    await store.claim({ id: 'p3', token: 't', fingerprint: '', leaseMs: 1_000 });
    expect(await store.get('old')).toBeUndefined();
    for (const id of ['p1', 'p2', 'p3']) expect((await store.get(id))?.state).toBe('in_progress');
    // Full of live claims: it grows rather than drop one, since dropping would allow a second execution.
    await store.claim({ id: 'p4', token: 't', fingerprint: '', leaseMs: 1_000 });
    expect(store.size).toBe(4);
  });

  it('reports each completed record dropped before its retention ended, and not the expired ones', async () => {
    let now = 0;
    const evictions: unknown[] = [];
    const store = memoryStore({ maxEntries: 2, now: () => now, onEvict: (eviction) => evictions.push(eviction) });
    const done = { status: 201, headers: {}, body: new Uint8Array() };
    const completed = async (id: string, retentionMs: number) => {
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: 1_000 });
      await store.complete({ id, token: 't', response: done, retentionMs });
    };
    await completed('short', 100);
    await completed('long', 86_400_000);
    now = 500; // 'short' has expired, 'long' is within its retention
    await store.claim({ id: 'c', token: 't', fingerprint: '', leaseMs: 1_000 });
    // Room came from the expired record: nothing a retry still counts on was lost.
    expect(evictions).toEqual([]);
    expect(store.evicted).toBe(0);
    await store.claim({ id: 'd', token: 't', fingerprint: '', leaseMs: 1_000 });
    expect(evictions).toEqual([{ id: 'long', expiresAt: 86_400_000, at: 500 }]);
    expect(store.evicted).toBe(1);
    expect(await store.get('long')).toBeUndefined();
  });

  it('keeps making room when the eviction observer throws', async () => {
    const store = memoryStore({
      maxEntries: 1,
      now: () => 0,
      onEvict: () => {
        throw new Error('observer bug');
      },
    });
    const done = { status: 201, headers: {}, body: new Uint8Array() };
    await store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 });
    await store.complete({ id: 'a', token: 't', response: done, retentionMs: 10_000 });
    expect(await store.claim({ id: 'b', token: 't', fingerprint: '', leaseMs: 1_000 })).toEqual({ claimed: true });
    expect(store.size).toBe(1);
    expect(store.evicted).toBe(1);
  });

  it('rejects a bad maxEntries or onEvict at construction', () => {
    expect(() => memoryStore({ maxEntries: 0 })).toThrow(TypeError);
    expect(() => memoryStore({ onEvict: 'log' as never })).toThrow(/onEvict must be a function/);
  });
});
