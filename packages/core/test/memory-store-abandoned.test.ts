import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { memoryStore } from '../src/memory-store.js';
import type { StoredResponse } from '../src/store.js';

// Mutation tests of the memory store's abandoned records (keepAfterLeaseMs, replaces): each check
// below fails on a mutant of memory-store.ts that the store contract suite let through.

const response: StoredResponse = { status: 201, headers: {}, body: new Uint8Array([1]) };
const DAY = 86_400_000;

function setup() {
  const clock = { now: 1_000 };
  const store = memoryStore({ now: () => clock.now });
  return { clock, store };
}

describe('memoryStore: which abandoned record a claim naming `replaces` takes over', () => {
  it('never a completed record, even one whose token it names (a late finisher completed it meanwhile)', async () => {
    const { clock, store } = setup();
    await store.claim({ id: 'k', token: 'a', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: DAY });
    clock.now += 1_000;
    expect((await store.get('k'))?.state).toBe('abandoned');
    // The engine read the abandoned record's token; before its takeover lands, the holder completes.
    expect(await store.complete({ id: 'k', token: 'a', response, retentionMs: DAY })).toBe(true);
    const takeover = await store.claim({
      id: 'k',
      token: 'b',
      fingerprint: 'fp',
      leaseMs: 1_000,
      keepAfterLeaseMs: DAY,
      replaces: 'a',
    });
    expect(takeover.claimed === false && takeover.record.state).toBe('completed');
    const record = await store.get('k');
    expect(record?.state === 'completed' && record.token).toBe('a');
  });

  it('never a live lease, even one whose token it names (its holder renewed in time)', async () => {
    const { clock, store } = setup();
    await store.claim({ id: 'k', token: 'a', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: DAY });
    clock.now += 999;
    const takeover = await store.claim({
      id: 'k',
      token: 'b',
      fingerprint: 'fp',
      leaseMs: 1_000,
      keepAfterLeaseMs: DAY,
      replaces: 'a',
    });
    expect(takeover).toEqual({ claimed: false, record: { state: 'in_progress', token: 'a', fingerprint: 'fp' } });
    expect(await store.renew({ id: 'k', token: 'a', leaseMs: 1_000 })).toBe(true);
  });

  it('the abandoned one from the very moment a read calls it abandoned (the lease end is one instant)', async () => {
    const { clock, store } = setup();
    await store.claim({ id: 'k', token: 'a', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: DAY });
    clock.now += 1_000;
    expect((await store.get('k'))?.state).toBe('abandoned');
    expect(
      await store.claim({
        id: 'k',
        token: 'b',
        fingerprint: 'fp',
        leaseMs: 1_000,
        keepAfterLeaseMs: DAY,
        replaces: 'a',
      }),
    ).toEqual({ claimed: true });
  });
});

describe('memoryStore: how long a record taken over is kept', () => {
  it('for the keep the takeover asked for, not the crashed claim’s', async () => {
    const { clock, store } = setup();
    await store.claim({ id: 'k', token: 'a', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: 1_000 });
    clock.now += 1_000;
    await store.claim({
      id: 'k',
      token: 'b',
      fingerprint: 'fp',
      leaseMs: 1_000,
      keepAfterLeaseMs: 5_000,
      replaces: 'a',
    });
    // The takeover crashes too: abandoned for its own keep of 5 s after its lease.
    clock.now += 1_000 + 4_999;
    expect(await store.get('k')).toEqual({ state: 'abandoned', token: 'b', fingerprint: 'fp' });
    clock.now += 1;
    expect(await store.get('k')).toBeUndefined();
  });

  it('with the fingerprint of the takeover: a fingerprintless crash taken over with one keeps that one', async () => {
    const { clock, store } = setup();
    await store.claim({ id: 'k', token: 'a', fingerprint: '', leaseMs: 1_000, keepAfterLeaseMs: DAY });
    clock.now += 1_000;
    await store.claim({ id: 'k', token: 'b', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: DAY, replaces: 'a' });
    expect(await store.get('k')).toEqual({ state: 'in_progress', token: 'b', fingerprint: 'fp' });
  });
});

describe('memoryStore: making room when full', () => {
  it('drops the abandoned record that ends first, before a completed one still within its retention', async () => {
    let now = 0;
    const evictions: string[] = [];
    const store = memoryStore({ maxEntries: 2, now: () => now, onEvict: ({ id }) => evictions.push(id) });
    await store.claim({ id: 'crashed', token: 'a', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: 10_000 });
    now = 1_000;
    await store.claim({ id: 'done', token: 'b', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: 10_000 });
    await store.complete({ id: 'done', token: 'b', response, retentionMs: DAY });
    await store.claim({ id: 'new', token: 'c', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: 10_000 });
    expect(evictions).toEqual(['crashed']);
    expect((await store.get('done'))?.state).toBe('completed');
  });

  it('finds an abandoned record behind a live lease filed before it', async () => {
    // Two claims whose lease and keep add up to the same duration, the live one first (they once
    // shared a lane, the live one at its head and the abandoned one behind it).
    let now = 0;
    const evictions: string[] = [];
    const store = memoryStore({ maxEntries: 2, now: () => now, onEvict: ({ id }) => evictions.push(id) });
    await store.claim({ id: 'live', token: 'a', fingerprint: 'fp', leaseMs: 5_000, keepAfterLeaseMs: 1_000 });
    await store.claim({ id: 'crashed', token: 'b', fingerprint: 'fp', leaseMs: 1_000, keepAfterLeaseMs: 5_000 });
    now = 1_000;
    await store.claim({ id: 'new', token: 'c', fingerprint: 'fp', leaseMs: 5_000, keepAfterLeaseMs: 1_000 });
    expect(evictions).toEqual(['crashed']);
    expect(store.size).toBe(2);
    expect((await store.get('live'))?.state).toBe('in_progress');
  });
});

describe('memoryStore: memory follows what is kept', () => {
  // A lane is only walked from its head. When a claim was filed in the lane of `leaseMs +
  // keepAfterLeaseMs` (a day, from the engine), an abandoned record at that head stayed there for its
  // whole keep, and every slot filed behind it (each later claim's, each renewal's) kept its entry
  // reachable until then: entries released, completed and expired, or evicted long ago (about 45 MB
  // for the 100,000 cycles below). A claim is now filed by its lease's end, and moves on to the
  // lane of its keep only once abandoned.
  it('one abandoned record does not keep every later released entry in memory for its keep', () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const cycles = (abandoned: boolean) => {
      let now = 0;
      const store = memoryStore({ now: () => now });
      if (abandoned)
        store.claim({ id: 'crashed', token: 't', fingerprint: 'fp', leaseMs: 10_000, keepAfterLeaseMs: DAY });
      now += 10_000;
      gc();
      const before = process.memoryUsage().heapUsed;
      for (let i = 0; i < 100_000; i++) {
        const id = `request-${i}-${'x'.repeat(48)}`;
        store.claim({ id, token: `t${i}`, fingerprint: 'f'.repeat(64), leaseMs: 10_000, keepAfterLeaseMs: DAY });
        // A 5xx under storeOutcome 'success', a failed webhook: the key is released, nothing kept.
        store.release({ id, token: `t${i}` });
        now += 1;
      }
      gc();
      const grown = process.memoryUsage().heapUsed - before;
      return { store, grown };
    };
    const clean = cycles(false);
    const stuck = cycles(true);
    expect(clean.store.size).toBe(0);
    expect(stuck.store.size).toBe(1);
    // About 45 MB here (every released entry with its id, token and fingerprint), against none.
    expect(stuck.grown).toBeLessThan(10_000_000);
  });
});

describe('memoryStore: a forgotten record frees its body at once', () => {
  // Its slot stays in its lane (or heap) until its due time, skipped as gone, and held the entry, body
  // included, for up to its retention, while `bytes` already said it was freed.
  it('the body of a forgotten record is not kept until the record would have expired', () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const store = memoryStore({ now: () => 0 });
    const body = new Uint8Array(32 * 1024 * 1024).fill(7);
    store.claim({ id: 'big', token: 't', fingerprint: 'fp', leaseMs: 10_000 });
    expect(
      store.complete({ id: 'big', token: 't', response: { status: 200, headers: {}, body }, retentionMs: DAY }),
    ).toBe(true);
    // A large body is kept as an external string: counted outside the heap.
    const used = () => {
      const { heapUsed, external } = process.memoryUsage();
      return heapUsed + external;
    };
    gc();
    const kept = used();
    expect(store.forget({ id: 'big', token: 't' })).toBe(true);
    gc();
    expect(kept - used()).toBeGreaterThan(24 * 1024 * 1024);
  });
});
