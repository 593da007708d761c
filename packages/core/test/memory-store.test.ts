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

  it('rejects a bad maxEntries at construction', () => {
    expect(() => memoryStore({ maxEntries: 0 })).toThrow(TypeError);
  });
});
