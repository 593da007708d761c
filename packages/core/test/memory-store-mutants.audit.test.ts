import { describe, expect, it } from 'vitest';
import { memoryStore } from '../src/memory-store.js';

// Mutation tests of memory-store.ts: each check fails on a mutant of a line that carries a decision
// and that the other tests let through.

const done = { status: 201, headers: {}, body: new Uint8Array() };

describe('memoryStore eviction beside a claim in progress of the same duration', () => {
  it('drops the completed record nearest the end of its retention, not a later one', async () => {
    let now = 0;
    const store = memoryStore({ maxEntries: 3, now: () => now });
    // A lease and a retention of one duration (they once shared a lane, headed by the claim in
    // progress): the two completed records filed after the claim end 1 s apart.
    store.claim({ id: 'running', token: 't', fingerprint: '', leaseMs: 60_000 });
    store.claim({ id: 'sooner', token: 't', fingerprint: '', leaseMs: 60_000 });
    store.complete({ id: 'sooner', token: 't', response: done, retentionMs: 60_000 });
    now = 1_000;
    store.claim({ id: 'later', token: 't', fingerprint: '', leaseMs: 60_000 });
    store.complete({ id: 'later', token: 't', response: done, retentionMs: 60_000 });
    store.claim({ id: 'next', token: 't', fingerprint: '', leaseMs: 60_000 });
    expect(await store.get('sooner')).toBeUndefined();
    expect((await store.get('later'))?.state).toBe('completed');
    expect((await store.get('running'))?.state).toBe('in_progress');
    expect(store.evicted).toBe(1);
  });
});
