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
      advance: async (ms: number) => {
        now += ms;
      },
      endLease: async (_id: string, leaseMs: number) => {
        now += leaseMs;
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

  it('evicts an abandoned record (its lease ran out unrenewed) to make room, never a live lease', async () => {
    let now = 0;
    const evictions: { id: string }[] = [];
    const store = memoryStore({ maxEntries: 2, now: () => now, onEvict: (eviction) => evictions.push(eviction) });
    await store.claim({ id: 'crashed', token: 't', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: 86_400_000 });
    now = 1_000;
    expect(await store.get('crashed')).toEqual({ state: 'abandoned', token: 't', fingerprint: 'fp' });
    await store.claim({ id: 'live', token: 't', fingerprint: '', leaseMs: 5_000, keepAfterLeaseMs: 86_400_000 });
    await store.claim({ id: 'new', token: 't', fingerprint: '', leaseMs: 5_000, keepAfterLeaseMs: 86_400_000 });
    expect(evictions.map((eviction) => eviction.id)).toEqual(['crashed']);
    expect(await store.get('crashed')).toBeUndefined();
    expect((await store.get('live'))?.state).toBe('in_progress');
    // Two live leases and no room: the store grows rather than drop one.
    await store.claim({ id: 'third', token: 't', fingerprint: '', leaseMs: 5_000, keepAfterLeaseMs: 86_400_000 });
    expect(store.size).toBe(3);
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

  it('when full, drops what expired before any record within its retention, whatever the durations', async () => {
    let now = 0;
    const evictions: string[] = [];
    const store = memoryStore({ maxEntries: 3, now: () => now, onEvict: ({ id }) => evictions.push(id) });
    const done = { status: 201, headers: {}, body: new Uint8Array([1]) };
    const completed = (id: string, retentionMs: number) => {
      store.claim({ id, token: 't', fingerprint: '', leaseMs: 1_000 });
      store.complete({ id, token: 't', response: done, retentionMs });
    };
    completed('day', 86_400_000);
    completed('hour', 3_600_000);
    // A claim whose executor died: its lease ends at 1 s, behind records kept far longer.
    store.claim({ id: 'crashed', token: 't', fingerprint: '', leaseMs: 1_000 });
    now = 2_000;
    store.claim({ id: 'next-1', token: 't', fingerprint: '', leaseMs: 1_000 });
    expect(await store.get('crashed')).toBeUndefined();
    now = 3_600_001;
    // The hour has passed: its record goes, not the one kept for a day that was claimed before it.
    store.claim({ id: 'next-2', token: 't', fingerprint: '', leaseMs: 1_000_000 });
    expect(evictions).toEqual([]);
    expect((await store.get('day'))?.state).toBe('completed');
    expect(await store.get('hour')).toBeUndefined();
  });

  it('a renewed claim does not shield an expired one claimed after it', async () => {
    let now = 0;
    const store = memoryStore({ maxEntries: 3, now: () => now });
    store.claim({ id: 'kept', token: 't', fingerprint: '', leaseMs: 1_000 });
    store.complete({
      id: 'kept',
      token: 't',
      response: { status: 200, headers: {}, body: new Uint8Array() },
      retentionMs: 86_400_000,
    });
    store.claim({ id: 'alive', token: 't', fingerprint: '', leaseMs: 1_000 });
    store.claim({ id: 'dead', token: 't', fingerprint: '', leaseMs: 1_000 });
    now = 900;
    expect(store.renew({ id: 'alive', token: 't', leaseMs: 1_000 })).toBe(true);
    now = 1_500;
    store.claim({ id: 'new', token: 't', fingerprint: '', leaseMs: 1_000 });
    expect(store.evicted).toBe(0);
    expect((await store.get('kept'))?.state).toBe('completed');
    expect((await store.get('alive'))?.state).toBe('in_progress');
    expect(store.size).toBe(3);
  });

  it('over the bound with only live leases it grows; later, an ended lease goes before a completed record is evicted', async () => {
    let t = 0;
    const evictions: string[] = [];
    const store = memoryStore({ maxEntries: 3, now: () => t, onEvict: (e) => evictions.push(e.id) });
    const ok = { status: 201, headers: {}, body: new Uint8Array([1]) };
    const claim = (id: string) => store.claim({ id, token: id, fingerprint: '', leaseMs: 1_000 });
    claim('A'); // its lease ends at 1 000
    t = 5;
    claim('B');
    t = 10;
    store.renew({ id: 'B', token: 'B', leaseMs: 1_000 }); // ends at 1 010; its first slot is stale now
    t = 20;
    claim('E');
    claim('F'); // over the bound with every head in progress: nothing may be dropped, nothing is moved
    t = 30;
    store.release({ id: 'E', token: 'E' });
    store.release({ id: 'F', token: 'F' });
    claim('C');
    t = 40;
    store.complete({ id: 'C', token: 'C', response: ok, retentionMs: 100_000 });
    // A's lease has ended, B's has not: room for D comes from A, and nothing live is evicted.
    t = 1_005;
    claim('D');
    expect(evictions).toEqual([]);
    expect((await store.get('C'))?.state).toBe('completed');
    expect(await store.get('A')).toBeUndefined();
  });

  it('when a lease and a retention are equal, drops a completed record claimed after records in progress, never one of those', async () => {
    const store = memoryStore({ maxEntries: 2, now: () => 0 });
    const ok = { status: 201, headers: {}, body: new Uint8Array() };
    store.claim({ id: 'running', token: 't', fingerprint: '', leaseMs: 60_000 });
    store.claim({ id: 'done', token: 't', fingerprint: '', leaseMs: 60_000 });
    store.complete({ id: 'done', token: 't', response: ok, retentionMs: 60_000 });
    store.claim({ id: 'next', token: 't', fingerprint: '', leaseMs: 60_000 });
    expect(await store.get('done')).toBeUndefined();
    expect((await store.get('running'))?.state).toBe('in_progress');
    expect((await store.get('next'))?.state).toBe('in_progress');
    expect(store.evicted).toBe(1);
  });

  it('evicts the completed record nearest the end of its retention when nothing has expired', async () => {
    const store = memoryStore({ maxEntries: 2, now: () => 0 });
    const done = { status: 201, headers: {}, body: new Uint8Array() };
    store.claim({ id: 'long', token: 't', fingerprint: '', leaseMs: 1_000 });
    store.complete({ id: 'long', token: 't', response: done, retentionMs: 86_400_000 });
    store.claim({ id: 'short', token: 't', fingerprint: '', leaseMs: 1_000 });
    store.complete({ id: 'short', token: 't', response: done, retentionMs: 60_000 });
    store.claim({ id: 'new', token: 't', fingerprint: '', leaseMs: 1_000 });
    expect(await store.get('short')).toBeUndefined();
    expect((await store.get('long'))?.state).toBe('completed');
  });

  it('stays bounded and in order when every record has a retention of its own (computed retentions)', async () => {
    let now = 0;
    const store = memoryStore({ maxEntries: 100, now: () => now });
    const done = { status: 201, headers: {}, body: new Uint8Array() };
    for (let i = 0; i < 1_000; i++) {
      now = i;
      store.claim({ id: `r${i}`, token: 't', fingerprint: '', leaseMs: 1_000 });
      // Retentions from 1 s to about 17 minutes, all different.
      store.complete({ id: `r${i}`, token: 't', response: done, retentionMs: 1_000 + ((i * 7_919) % 1_000_000) });
    }
    expect(store.size).toBe(100);
    // Far in the future every record has expired: room comes from them, and nothing is reported evicted.
    const evictedBefore = store.evicted;
    now = 10_000_000;
    for (let i = 0; i < 50; i++) store.claim({ id: `late${i}`, token: 't', fingerprint: '', leaseMs: 1_000 });
    expect(store.evicted).toBe(evictedBefore);
    expect(store.size).toBeLessThanOrEqual(100);
  });

  it('hands every reader its own record: changing a replay does not change the next one', async () => {
    const store = memoryStore();
    store.claim({ id: 'a', token: 't', fingerprint: 'fp', leaseMs: 1_000 });
    store.complete({
      id: 'a',
      token: 't',
      response: {
        status: 201,
        headers: { 'content-type': 'application/json' },
        body: new TextEncoder().encode('{"id":1}'),
      },
      retentionMs: 60_000,
    });
    const first = await store.get('a');
    if (first?.state !== 'completed') throw new Error('expected a completed record');
    first.response.headers['set-cookie'] = 'sid=1';
    first.response.body.fill(0x2a);
    const claimed = await store.claim({ id: 'a', token: 'u', fingerprint: 'fp', leaseMs: 1 });
    for (const again of [await store.get('a'), claimed.claimed ? undefined : claimed.record]) {
      if (again?.state !== 'completed') throw new Error('expected a completed record');
      expect(again.response.headers).toEqual({ 'content-type': 'application/json' });
      expect(new TextDecoder().decode(again.response.body)).toBe('{"id":1}');
    }
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
    expect(() => memoryStore({ maxEntries: 1.5 })).toThrow(/maxEntries must be a positive integer/);
    expect(() => memoryStore({ maxEntries: Number.NaN })).toThrow(/maxEntries must be a positive integer/);
    expect(() => memoryStore({ onEvict: 'log' as never })).toThrow(/onEvict must be a function/);
  });

  const done = { status: 201, headers: {}, body: new Uint8Array() };

  it('memory follows the retention: claims sweep out records that expired, read or not, long before the store is full', () => {
    let now = 0;
    const store = memoryStore({ now: () => now });
    for (let i = 0; i < 1_000; i++) store.claim({ id: `old${i}`, token: 't', fingerprint: '', leaseMs: 1_000 });
    now = 1_000; // every one of those leases ends exactly now
    for (let i = 0; i < 1_000; i++) store.claim({ id: `new${i}`, token: 't', fingerprint: '', leaseMs: 1_000 });
    // Nobody read the old records, and 2,000 is far below the bound: the periodic sweep dropped
    // them, about as many as the new claims added.
    expect(store.size).toBeLessThan(1_100);
  });

  it('a record claimed again after its lease ran out survives the sweep of its old claim', async () => {
    let now = 0;
    const store = memoryStore({ now: () => now });
    store.claim({ id: 'a', token: 'first', fingerprint: '', leaseMs: 1_000 });
    now = 1_000; // the first executor crashed; a retry takes the key over
    expect(store.claim({ id: 'a', token: 'second', fingerprint: '', leaseMs: 1_000 })).toEqual({ claimed: true });
    // Enough claims for a sweep, which meets the first claim's expired slot first.
    for (let i = 0; i < 100; i++) store.claim({ id: `other${i}`, token: 't', fingerprint: '', leaseMs: 1_000 });
    // The retry's claim is intact: a third executor must not get in while the second runs.
    expect(await store.get('a')).toEqual({ state: 'in_progress', token: 'second', fingerprint: '' });
    expect((await store.claim({ id: 'a', token: 'third', fingerprint: '', leaseMs: 1_000 })).claimed).toBe(false);
  });

  it('when full, a record whose retention ends exactly now counts as expired, not as one to evict', async () => {
    let now = 0;
    const evictions: string[] = [];
    const store = memoryStore({ maxEntries: 2, now: () => now, onEvict: ({ id }) => evictions.push(id) });
    for (const [id, retentionMs] of [
      ['short', 100],
      ['long', 86_400_000],
    ] as const) {
      store.claim({ id, token: 't', fingerprint: '', leaseMs: 1_000 });
      store.complete({ id, token: 't', response: done, retentionMs });
    }
    now = 100;
    store.claim({ id: 'c', token: 't', fingerprint: '', leaseMs: 1_000 });
    expect(evictions).toEqual([]);
    expect((await store.get('long'))?.state).toBe('completed');
  });

  it('when full, an expired record goes before a live one is evicted, whatever order their retentions were set in', async () => {
    // Two retentions close together, the longer one set first: each has a queue of its own, so the
    // shorter one's expiry is seen although the longer one was filed before it.
    let now = 0;
    const evictions: string[] = [];
    const store = memoryStore({ maxEntries: 2, now: () => now, onEvict: ({ id }) => evictions.push(id) });
    for (const [id, retentionMs] of [
      ['longer', 2_000],
      ['shorter', 1_100],
    ] as const) {
      store.claim({ id, token: 't', fingerprint: '', leaseMs: 1_000 });
      store.complete({ id, token: 't', response: done, retentionMs });
    }
    now = 1_500;
    store.claim({ id: 'c', token: 't', fingerprint: '', leaseMs: 1_000 });
    expect(evictions).toEqual([]);
    expect((await store.get('longer'))?.state).toBe('completed');
  });

  it('finds a completed record to evict behind several records in progress', async () => {
    const store = memoryStore({ maxEntries: 4, now: () => 0 });
    // A lease and a retention of one duration: the completed record was claimed after three still running.
    for (const id of ['r1', 'r2', 'r3', 'done']) store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 });
    store.complete({ id: 'done', token: 't', response: done, retentionMs: 60_000 });
    store.claim({ id: 'next', token: 't', fingerprint: '', leaseMs: 60_000 });
    expect(await store.get('done')).toBeUndefined();
    expect(store.evicted).toBe(1);
    expect(store.size).toBe(4);
  });

  it('forget gives back what the record counted: size and bytes go down, and the next record needs no room made', async () => {
    const store = memoryStore({ maxEntries: 2, maxBytes: 1_000, now: () => 0 });
    const small = { status: 201, headers: {}, body: new Uint8Array(10) };
    const large = { status: 500, headers: { 'content-type': 'text/plain' }, body: new Uint8Array(700) };
    store.claim({ id: 'kept', token: 't', fingerprint: 'fp', leaseMs: 1_000 });
    store.complete({ id: 'kept', token: 't', response: small, retentionMs: 60_000 });
    const keptBytes = store.bytes;
    store.claim({ id: 'wrong', token: 'w', fingerprint: 'fp', leaseMs: 1_000 });
    store.complete({ id: 'wrong', token: 'w', response: large, retentionMs: 60_000 });
    expect(store.bytes).toBeGreaterThan(keptBytes + 700);
    expect(store.forget({ id: 'wrong', token: 'w' })).toBe(true);
    expect(store.size).toBe(1);
    expect(store.bytes).toBe(keptBytes);
    // A record in progress counts and is given back too.
    store.claim({ id: 'hung', token: 'h', fingerprint: 'fp', leaseMs: 1_000 });
    expect(store.bytes).toBeGreaterThan(keptBytes);
    expect(store.forget({ id: 'hung', token: 'h' })).toBe(true);
    expect(store.size).toBe(1);
    expect(store.bytes).toBe(keptBytes);
    // Counted still, the forgotten bytes and entries would make this claim and completion push out
    // 'kept', whose retry would then run again.
    store.claim({ id: 'next', token: 'n', fingerprint: 'fp', leaseMs: 1_000 });
    store.complete({ id: 'next', token: 'n', response: large, retentionMs: 60_000 });
    expect(store.evicted).toBe(0);
    expect((await store.get('kept'))?.state).toBe('completed');
    expect(store.size).toBe(2);
  });
});
