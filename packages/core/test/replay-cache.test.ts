import { transactionalMemoryStore } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyOptions } from '../src/engine-options.js';
import type { IdempotencyEvent } from '../src/events.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store, StoredResponse } from '../src/store.js';

// A memory store dressed as a shared one (not `inProcess`), counting what the engine asks of it.
function sharedStore(now: () => number) {
  const inner = memoryStore({ now });
  const calls = { claim: 0, get: 0, complete: 0 };
  const store: Store = {
    claim: (input) => {
      calls.claim++;
      return Promise.resolve(inner.claim(input));
    },
    renew: (input) => Promise.resolve(inner.renew(input)),
    complete: (input) => {
      calls.complete++;
      return Promise.resolve(inner.complete(input));
    },
    release: (input) => Promise.resolve(inner.release(input)),
    get: (id) => {
      calls.get++;
      return Promise.resolve(inner.get(id));
    },
  };
  return { store, inner, calls };
}

const response: StoredResponse = { status: 201, headers: { 'content-type': 'text/plain' }, body: Buffer.from('ch_1') };
const request = (key: string, fingerprint = 'fp-1') => ({
  key,
  scope: 'user:1',
  operation: 'POST /charges',
  fingerprint,
});

function world(extra: Partial<IdempotencyOptions> = {}) {
  let t = 1_700_000_000_000;
  const now = () => t;
  const shared = sharedStore(now);
  const events: IdempotencyEvent[] = [];
  const engine = createIdempotency({
    store: shared.store,
    now,
    heartbeat: false,
    replayCache: { ttl: '1s' },
    onEvent: (event) => events.push(event),
    ...extra,
  });
  const run = async (key: string) => {
    const started = await engine.begin(request(key));
    if (started.kind !== 'execute') throw new Error(`expected execute, got ${started.kind}`);
    expect(await engine.complete(started.lease, response)).toEqual({ ok: true, stored: true });
  };
  return { engine, ...shared, events, run, advance: (ms: number) => (t += ms) };
}

describe('replayCache: completed outcomes of a shared store answered from this process', () => {
  it('replays and mismatches from the cache for its ttl, then asks the store again', async () => {
    const w = world();
    await w.run('k-1');
    expect(w.calls).toEqual({ claim: 1, get: 0, complete: 1 });
    for (let i = 0; i < 5; i++) {
      const again = await w.engine.begin(request('k-1'));
      expect(again).toEqual({ kind: 'replay', response });
    }
    const other = await w.engine.begin(request('k-1', 'fp-2'));
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
    // Written by this process: no store read since.
    expect(w.calls.claim).toBe(1);
    expect(w.events.filter((e) => e.type === 'replay').every((e) => e.type === 'replay' && e.cached)).toBe(true);
    // A hit does not extend the entry: at one second the store is asked again, once, and the answer
    // it gives is good for another second.
    w.advance(999);
    await w.engine.begin(request('k-1'));
    expect(w.calls.claim).toBe(1);
    w.advance(1);
    expect(await w.engine.begin(request('k-1'))).toEqual({ kind: 'replay', response });
    expect(w.calls.claim).toBe(2);
    expect(w.events.at(-1)).toMatchObject({ type: 'replay' });
    expect(w.events.at(-1)).not.toHaveProperty('cached');
    await w.engine.begin(request('k-1'));
    expect(w.calls.claim).toBe(2);
  });

  it('caches what another process stored when a claim finds it completed', async () => {
    const w = world();
    const elsewhere = createIdempotency({ store: w.store, now: () => 1_700_000_000_000, heartbeat: false });
    const started = await elsewhere.begin(request('k-2'));
    if (started.kind !== 'execute') throw new Error('expected execute');
    await elsewhere.complete(started.lease, response);
    const claims = w.calls.claim;
    expect(await w.engine.begin(request('k-2'))).toEqual({ kind: 'replay', response });
    expect(await w.engine.begin(request('k-2'))).toEqual({ kind: 'replay', response });
    expect(w.calls.claim).toBe(claims + 1);
  });

  it('never caches a key in progress or released: those are asked of the store each time', async () => {
    const w = world();
    // Held by another process (this one would answer its own lease's conflicts without the store).
    const elsewhere = createIdempotency({ store: w.store, now: () => 1_700_000_000_000, heartbeat: false });
    const first = await elsewhere.begin(request('k-3'));
    if (first.kind !== 'execute') throw new Error('expected execute');
    for (let i = 0; i < 2; i++) expect((await w.engine.begin(request('k-3'))).kind).toBe('reject');
    expect(w.calls.claim).toBe(3);
    await elsewhere.release(first.lease);
    expect((await w.engine.begin(request('k-3'))).kind).toBe('execute');
    // A policy that releases an outcome stores nothing to cache either.
    const released = world({ storeOutcome: 'success' });
    const run = await released.engine.begin(request('k-4'));
    if (run.kind !== 'execute') throw new Error('expected execute');
    await released.engine.complete(run.lease, { ...response, status: 500 });
    expect((await released.engine.begin(request('k-4'))).kind).toBe('execute');
  });

  it('caches what a transaction committed, and nothing of one that stored no outcome', async () => {
    const claims: string[] = [];
    const inner = transactionalMemoryStore();
    const store = {
      ...inner,
      claim: (input: Parameters<Store['claim']>[0]) => {
        claims.push(input.id);
        return inner.claim(input);
      },
    };
    const engine = createIdempotency({ store, heartbeat: false, replayCache: { ttl: '1m' }, storeOutcome: 'success' });
    for (const [key, status] of [
      ['tx-201', 201],
      ['tx-500', 500],
    ] as const) {
      const started = await engine.begin(request(key));
      if (started.kind !== 'execute') throw new Error('expected execute');
      const done = await engine.transaction(started.lease, async () => ({
        value: undefined,
        response: { ...response, status },
      }));
      expect(done).toMatchObject({ committed: true, stored: status === 201 });
    }
    expect(claims).toHaveLength(2);
    expect(await engine.begin(request('tx-201'))).toEqual({ kind: 'replay', response });
    expect(claims).toHaveLength(2);
    // Released by the policy: the store is asked, and the key runs again.
    expect((await engine.begin(request('tx-500'))).kind).toBe('execute');
    expect(claims).toHaveLength(3);
  });

  it('holds at most `entries` records, dropping the one cached first', async () => {
    const w = world({ replayCache: { ttl: '1m', entries: 2 } });
    for (const key of ['a', 'b', 'c']) await w.run(key);
    const claims = w.calls.claim;
    await w.engine.begin(request('b'));
    await w.engine.begin(request('c'));
    expect(w.calls.claim).toBe(claims);
    await w.engine.begin(request('a'));
    expect(w.calls.claim).toBe(claims + 1);
  });

  it('takes no part with a store in this process, and refuses a ttl or bound that means nothing', async () => {
    const store = memoryStore();
    const seen: string[] = [];
    const counted: Store = {
      ...store,
      inProcess: true,
      claim: (input) => {
        seen.push(input.id);
        return store.claim(input);
      },
    };
    const engine = createIdempotency({ store: counted, replayCache: { ttl: '1s' } });
    const started = await engine.begin(request('k-5'));
    if (started.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(started.lease, response);
    await engine.begin(request('k-5'));
    expect(seen).toHaveLength(2);
    const made = (replayCache: unknown) => () => createIdempotency({ store, replayCache: replayCache as never });
    for (const bad of [
      { ttl: 0 },
      { ttl: '2h' },
      { ttl: 'soon' },
      { ttl: '1s', entries: 0 },
      { ttl: '1s', entries: 1.5 },
      'yes',
      null,
    ]) {
      expect(made(bad), JSON.stringify(bad)).toThrow(TypeError);
    }
    for (const good of [false, undefined, { ttl: 1 }, { ttl: '1h', entries: 1 }]) expect(made(good)).not.toThrow();
  });

  // Before, `entries: null` took the default bound in silence, while `entries: 0` threw. Only a
  // missing (or undefined) field takes a default; any other value that is no bound is refused, by name.
  it('refuses a ttl or entries that is not one, null included, with a TypeError naming the field', () => {
    const store = memoryStore();
    const made = (replayCache: unknown) => () => createIdempotency({ store, replayCache: replayCache as never });
    const bad: Array<[string, unknown]> = [
      ['replayCache.entries', { ttl: '1s', entries: null }],
      ['replayCache.entries', { ttl: '1s', entries: '100' }],
      ['replayCache.entries', { ttl: '1s', entries: Number.NaN }],
      ['replayCache.entries', { ttl: '1s', entries: -1 }],
      ['replayCache.entries', { ttl: '1s', entries: 2.5 }],
      ['replayCache.entries', { ttl: '1s', entries: Number.POSITIVE_INFINITY }],
      ['replayCache.entries', { ttl: '1s', entries: true }],
      ['replayCache.ttl', { ttl: null }],
      ['replayCache.ttl', { entries: 10 }],
      ['replayCache.ttl', { ttl: '100' }],
      ['replayCache.ttl', { ttl: Number.NaN }],
      ['replayCache.ttl', { ttl: -1 }],
      ['replayCache.ttl', { ttl: true }],
    ];
    for (const [name, value] of bad) {
      const label = String(Object.entries(value as object).map(([field, v]) => `${field}: ${String(v)}`));
      expect(made(value), label).toThrow(TypeError);
      expect(made(value), label).toThrow(name);
    }
    expect(made({ ttl: '1s', entries: undefined })).not.toThrow();
  });
});
