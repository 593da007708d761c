import { describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyOptions } from '../src/engine-options.js';
import { memoryStore } from '../src/memory-store.js';
import type { ClaimResult, Store, StoredResponse } from '../src/store.js';

// A memory store dressed as a shared one (not `inProcess`), counting claims; while `gated`, each
// claim's answer is held until the test lets it through, to order two requests' answers at will.
function sharedStore(now: () => number) {
  const inner = memoryStore({ now });
  const calls = { claim: 0 };
  const held: Array<() => void> = [];
  const gate = { gated: false };
  const store: Store = {
    claim: (input) => {
      calls.claim++;
      const answer = inner.claim(input) as ClaimResult;
      if (!gate.gated) return Promise.resolve(answer);
      return new Promise<ClaimResult>((resolve) => held.push(() => resolve(answer)));
    },
    renew: (input) => Promise.resolve(inner.renew(input)),
    complete: (input) => Promise.resolve(inner.complete(input)),
    release: (input) => Promise.resolve(inner.release(input)),
    get: (id) => Promise.resolve(inner.get(id)),
  };
  return { store, calls, held, gate };
}

const response: StoredResponse = { status: 201, headers: { 'content-type': 'text/plain' }, body: Buffer.from('ch_1') };
const request = (key: string, scope = 'user:1', operation = 'POST /charges') => ({
  key,
  scope,
  operation,
  fingerprint: 'fp-1',
});

function world(extra: Partial<IdempotencyOptions> = {}) {
  const t = 1_700_000_000_000;
  const now = () => t;
  const shared = sharedStore(now);
  const engine = createIdempotency({
    store: shared.store,
    now,
    heartbeat: false,
    replayCache: { ttl: '1m' },
    ...extra,
  });
  // Another process on the same store: what it completes, this engine only learns from the store.
  const elsewhere = createIdempotency({ store: shared.store, now, heartbeat: false });
  const run = async (on: typeof engine, key: string, scope?: string) => {
    const started = await on.begin(request(key, scope));
    if (started.kind !== 'execute') throw new Error(`expected execute, got ${started.kind}`);
    expect(await on.complete(started.lease, response)).toEqual({ ok: true, stored: true });
  };
  return { engine, elsewhere, run, ...shared };
}

// Lets every pending promise callback run (no timer, no clock).
const settled = () => new Promise((resolve) => setImmediate(resolve));

describe('replayCache: what the first tests of the cache left open', () => {
  it("never answers another caller, or another operation, with a caller's cached outcome", async () => {
    const w = world();
    await w.run(w.engine, 'k-1');
    expect(await w.engine.begin(request('k-1'))).toEqual({ kind: 'replay', response });
    // The same key from another caller, or on another route, is another record (spec 5.11).
    expect((await w.engine.begin(request('k-1', 'user:2'))).kind).toBe('execute');
    expect((await w.engine.begin(request('k-1', 'user:1', 'POST /refunds'))).kind).toBe('execute');
  });

  it('keeps more than one outcome by default (10,000 of them)', async () => {
    const w = world({ replayCache: { ttl: '1m' } });
    for (const key of ['a', 'b', 'c']) await w.run(w.engine, key);
    const claims = w.calls.claim;
    for (const key of ['a', 'b', 'c']) expect(await w.engine.begin(request(key))).toEqual({ kind: 'replay', response });
    expect(w.calls.claim).toBe(claims);
  });

  it('answers from the cache when requests wait for a key in progress (wait) too', async () => {
    const w = world({ wait: '1s' });
    await w.run(w.engine, 'k-w');
    const claims = w.calls.claim;
    expect(await w.engine.begin(request('k-w'))).toEqual({ kind: 'replay', response });
    expect(w.calls.claim).toBe(claims);
  });

  it('an entry written again goes to the back of the eviction order', async () => {
    // Two requests for `a` miss the cache together; their claims answer around one for `b`. The
    // second answer for `a` refreshes its entry, so `c` evicts `b` (cached first), not `a`.
    const w = world({ replayCache: { ttl: '1m', entries: 2 } });
    for (const key of ['a', 'b', 'c']) await w.run(w.elsewhere, key);
    w.gate.gated = true;
    const first = w.engine.begin(request('a'));
    const second = w.engine.begin(request('a'));
    await settled();
    expect(w.held).toHaveLength(2);
    w.gate.gated = false;
    w.held[0]?.();
    expect(await first).toEqual({ kind: 'replay', response });
    expect(await w.engine.begin(request('b'))).toEqual({ kind: 'replay', response });
    w.held[1]?.();
    expect(await second).toEqual({ kind: 'replay', response });
    expect(await w.engine.begin(request('c'))).toEqual({ kind: 'replay', response });
    const claims = w.calls.claim;
    await w.engine.begin(request('a'));
    expect(w.calls.claim).toBe(claims);
    await w.engine.begin(request('b'));
    expect(w.calls.claim).toBe(claims + 1);
  });
});

describe('replayCache: what it keeps is its own copy', () => {
  it('a response object the caller of complete() changes afterwards does not change the cached replay', async () => {
    const w = world();
    const started = await w.engine.begin(request('k-copy'));
    if (started.kind !== 'execute') throw new Error(`expected execute, got ${started.kind}`);
    const given: StoredResponse = { status: 201, headers: { 'content-type': 'text/plain' }, body: Buffer.from('ch_1') };
    expect(await w.engine.complete(started.lease, given)).toEqual({ ok: true, stored: true });
    // A caller that reuses its objects for the next response, as a store's copy would not notice.
    given.headers['content-type'] = 'application/json';
    given.body.fill(0x78);
    const claims = w.calls.claim;
    expect(await w.engine.begin(request('k-copy'))).toEqual({ kind: 'replay', response });
    // Answered from the cache, not the store (whose copy was right all along).
    expect(w.calls.claim).toBe(claims);
  });
});
