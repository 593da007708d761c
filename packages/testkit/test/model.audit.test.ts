// Model-based audit of memoryStore: random histories of claim, renew, complete, release, get and
// time passing, from several holders over a few ids, compared at every step with the reference model
// of the Store contract (audit-support/store-model.ts). The store's clock is injected, so durations
// are a few milliseconds and every boundary (lease end, keep end, retention end) is hit exactly and
// one millisecond either side.
import { memoryStore } from '@idem/core';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { mapStore, storeBugs } from './audit-support/map-store.js';
import { checkLog, runConcurrently } from './audit-support/store-concurrency.js';
import {
  commandArbitrary,
  type Durations,
  fineDurations,
  newCoverage,
  playHistory,
  type SeenEviction,
} from './audit-support/store-model.js';

describe('memoryStore against the model of the Store contract', () => {
  it('answers every step of random histories as the model does, to the millisecond', async () => {
    const coverage = newCoverage();
    await fc.assert(
      fc.asyncProperty(
        fc.array(commandArbitrary(fineDurations), { minLength: 10, maxLength: 60, size: 'max' }),
        async (commands) => {
          let now = 0;
          const store = memoryStore({ now: () => now });
          const advance = (ms: number) => {
            now += ms;
          };
          await playHistory({ store, advance }, commands, ['a', 'b', 'c'], coverage);
        },
      ),
      { numRuns: 2_000 },
    );
    // The histories reached what they are for: takeovers, abandoned records, fenced tokens.
    for (const [what, count] of Object.entries(coverage)) expect(count, what).toBeGreaterThan(50);
  });
});

// More distinct leases, keeps and retentions than the memory store has lanes for (32 each).
const manyDurations: Durations = {
  leases: Array.from({ length: 40 }, (_, i) => 3 + i * 7),
  keeps: [0, ...Array.from({ length: 40 }, (_, i) => 5 + i * 11)],
  retentions: Array.from({ length: 40 }, (_, i) => 2 + i * 13),
  advances: [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233],
};

// Random histories on a fresh unbounded-enough memoryStore, every answer compared with the model.
const matchModel = (durations: Durations, length: { minLength: number; maxLength: number }, numRuns: number) =>
  fc.assert(
    fc.asyncProperty(fc.array(commandArbitrary(durations, 4), length), async (commands) => {
      let now = 0;
      const store = memoryStore({ maxEntries: 1_000, now: () => now });
      const advance = (ms: number) => {
        now += ms;
      };
      await playHistory({ store, advance }, commands, ['a', 'b', 'c', 'd']);
    }),
    { numRuns },
  );

describe('memoryStore against the model over long histories', () => {
  // Long enough for the store's sweep (every 64th claim drains each lane's due heads), with a bound
  // high enough that nothing is evicted: a sweep must never take a live record.
  it('answers every step as the model does through its periodic sweeps', async () => {
    await matchModel(fineDurations, { minLength: 300, maxLength: 400 }, 150);
  });

  // Past 32 distinct durations the store files the rest in a heap instead of lanes of their own:
  // no answer may change.
  it('answers every step as the model does once durations outnumber the lanes', async () => {
    await matchModel(manyDurations, { minLength: 200, maxLength: 300 }, 150);
  });
});

describe('a full memoryStore against the model of the Store contract and its eviction rule', () => {
  // Random histories on a store bounded at `maxEntries` of up to 4, checked after each claim against
  // the documented rule (see checkEvictions): expired records first, then the settled one nearest its end.
  const fillAndEvict = async (durations: Durations, length: number, numRuns: number) => {
    const coverage = newCoverage();
    let evictions = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 4 }),
        fc.array(commandArbitrary(durations, 6), { minLength: 10, maxLength: length, size: 'max' }),
        async (maxEntries, commands) => {
          let now = 0;
          const seen: SeenEviction[] = [];
          const store = memoryStore({ maxEntries, now: () => now, onEvict: (e) => seen.push(e) });
          const advance = (ms: number) => {
            now += ms;
          };
          const bounded = { maxEntries, size: () => store.size, evictions: () => seen.splice(0) };
          await playHistory({ store, advance, bounded }, commands, ['a', 'b', 'c', 'd', 'e', 'f'], coverage);
          evictions += store.evicted;
        },
      ),
      { numRuns },
    );
    return evictions;
  };

  it('evicts only settled records, never a live lease, in the documented order, and makes room when it can', async () => {
    expect(await fillAndEvict(fineDurations, 80, 2_000)).toBeGreaterThan(100);
  });

  // Durations past the lanes' count are filed in a heap: eviction must find the soonest there too.
  it('evicts in the documented order once durations outnumber the lanes', async () => {
    expect(await fillAndEvict(manyDurations, 200, 300)).toBeGreaterThan(100);
  });

  const ok = { status: 200, headers: {}, body: new Uint8Array(0) };

  // Shrunk from the eviction property above. An entry that leaves a lane and comes back to it
  // (lease lane, then a renewal's, then a takeover's lease of the first duration) has its old slot
  // there taken for its current one, ahead of records that were filed after it: when full, the
  // store found the expired record behind it only by looking behind the heads, and reported it as
  // evicted, which the docs say expired records never are (onEvict is the operator's signal to raise
  // maxEntries, and `evicted` counts records a retry would run again).
  it("when full, an expired record found behind the lanes' heads goes without being reported as evicted", async () => {
    let t = 0;
    const evicted: string[] = [];
    const store = memoryStore({ maxEntries: 2, now: () => t, onEvict: ({ id }) => evicted.push(id) });
    store.claim({ id: 'crashed', token: 'a1', fingerprint: '', leaseMs: 10, keepAfterLeaseMs: 50 });
    store.claim({ id: 'done', token: 'd', fingerprint: '', leaseMs: 1 });
    store.complete({ id: 'done', token: 'd', response: ok, retentionMs: 10 }); // ends at 10
    store.renew({ id: 'crashed', token: 'a1', leaseMs: 1 });
    t = 36; // 'done' has expired; 'crashed' is abandoned, and taken over with a lease of 10 again
    expect(store.claim({ id: 'crashed', token: 'a2', fingerprint: '', leaseMs: 10, replaces: 'a1' })).toEqual({
      claimed: true,
    });
    store.claim({ id: 'next', token: 'n', fingerprint: '', leaseMs: 1 });
    expect(evicted).toEqual([]);
    expect(store.evicted).toBe(0);
    expect(store.size).toBe(2);
  });

  // Was wrong: docs/stores.md and MemoryStoreOptions.maxEntries say that when the store is full,
  // "every expired record goes first (whatever its duration)". An abandoned record is filed in the
  // lane of its keep when a drain finds its lease over, which is after its lease ended; a record
  // completed in between with a retention equal to that keep (the engine passes its retention as
  // the keep, so this is the usual case) is ahead of it in that lane yet ends later. Once the
  // abandoned one has expired and the completed one has not, eviction stops at the lane's head and
  // drops the completed record (onEvict, a retry of its key runs again) while the expired one stays.
  // (A lane falls out of order another way too: an entry that leaves a lane and comes back to it, a
  // lease, a renewal of another length, a takeover with the first length, has its old slot there
  // read as its current one, ahead of records filed after it; see the test before.)
  // The fix needs a decision on the lanes (file an abandoned record in order, or keep lanes apart
  // from retention lanes, at a cost on the hot path): left to the maintainers.
  it('when full, an expired abandoned record goes before a completed one still within its retention', async () => {
    let t = 0;
    const evicted: string[] = [];
    const store = memoryStore({ maxEntries: 3, now: () => t, onEvict: ({ id }) => evicted.push(id) });
    store.claim({ id: 'crashed', token: 'a', fingerprint: '', leaseMs: 1, keepAfterLeaseMs: 50 }); // ends at 51
    store.claim({ id: 'done', token: 'c', fingerprint: '', leaseMs: 1, keepAfterLeaseMs: 50 });
    t = 2;
    store.complete({ id: 'done', token: 'c', response: ok, retentionMs: 50 }); // ends at 52
    store.claim({ id: 'short', token: 'f', fingerprint: '', leaseMs: 1 });
    store.complete({ id: 'short', token: 'f', response: ok, retentionMs: 10 }); // ends at 12
    // Full: 'short' is evicted (nearest its end), and 'crashed' is filed behind 'done'.
    store.claim({ id: 'running', token: 'e', fingerprint: '', leaseMs: 100 });
    expect(evicted).toEqual(['short']);
    t = 51; // 'crashed' has expired, 'done' has a millisecond left
    store.claim({ id: 'next', token: 'g', fingerprint: '', leaseMs: 100 });
    expect(evicted, 'the expired record makes the room').toEqual(['short']);
    expect((await store.get('done'))?.state).toBe('completed');
  });

  // Was wrong: the same docs say that, nothing having expired, "the completed and abandoned records
  // nearest their end" go. Eviction looks at each lane's head only (and behind the heads only when
  // every head is a live lease): an abandoned record filed in a lane behind a live lease of the same
  // duration is passed over, and a completed record ending later is dropped instead. Shrunk from the
  // eviction property above; same decision as the test before.
  it('when full, the abandoned record nearest its end goes before a completed one ending later', async () => {
    let t = 0;
    const evicted: string[] = [];
    const store = memoryStore({ maxEntries: 3, now: () => t, onEvict: ({ id }) => evicted.push(id) });
    store.claim({ id: 'done', token: 'd', fingerprint: '', leaseMs: 1 });
    store.claim({ id: 'crashed', token: 'a', fingerprint: '', leaseMs: 1, keepAfterLeaseMs: 10 }); // ends at 11
    store.complete({ id: 'done', token: 'd', response: ok, retentionMs: 60 }); // ends at 60
    t = 1;
    store.claim({ id: 'running', token: 'b', fingerprint: '', leaseMs: 10 }); // a lease as long as the keep
    store.claim({ id: 'next', token: 'e', fingerprint: '', leaseMs: 100 });
    expect(evicted).toEqual(['crashed']);
    expect((await store.get('done'))?.state).toBe('completed');
  });
});

describe('the model and the concurrency check catch a store with a known bug', () => {
  // The store of third-party-store.audit.test.ts, with its realistic mistakes one at a time. A
  // claim that overwrites an expired record with a second round trip is left out: the concurrent
  // run never lets a record expire (its leases and retention outlast it), describeStore() races it.
  // So is a forget that ignores the token: the model plays the engine's operations, and forget is
  // an operator's (describeStore() checks it). So is a store that drops the reason phrase: the model's
  // responses carry none (describeStore() checks it). So is a store that accepts any string: the
  // model's ids and tokens are plain ASCII (describeStore() checks it).
  const missed: readonly string[] = [
    'racy-overwrite-of-expired',
    'forget-ignores-token',
    'drops-status-message',
    'accepts-any-string',
  ];
  const caught = storeBugs.filter((bug) => !missed.includes(bug));

  it.each(caught)('%s', async (bug) => {
    const sequential = await fc.check(
      fc.asyncProperty(
        fc.array(commandArbitrary(fineDurations), { minLength: 10, maxLength: 60, size: 'max' }),
        async (commands) => {
          let now = 0;
          const store = mapStore({ now: () => now, bug });
          const advance = (ms: number) => {
            now += ms;
          };
          await playHistory({ store, advance }, commands, ['a', 'b', 'c']);
        },
      ),
      { numRuns: 300 },
    );
    let concurrent = false;
    for (let seed = 1; seed <= 30 && !concurrent; seed++) {
      const store = mapStore({ now: () => 0, bug });
      const endLease = async (id: string) => {
        const row = store.records.get(id);
        if (row?.state !== 'in_progress' || row.leaseUntil <= 0) return undefined;
        row.leaseUntil = 0;
        row.expiresAt = row.keepMs;
        return row.token;
      };
      try {
        checkLog(await runConcurrently({ store, endLease }, ['a', 'b', 'c'], { clients: 6, rounds: 60, seed }));
      } catch {
        concurrent = true;
      }
    }
    expect(sequential.failed || concurrent, 'neither the model nor the concurrency check noticed').toBe(true);
  });
});
