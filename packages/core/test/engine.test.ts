import { transactionalMemoryStore } from '@idem/testkit';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyOptions } from '../src/engine-options.js';
import type { BeginResult } from '../src/engine-types.js';
import type { IdempotencyEvent } from '../src/events.js';
import { fingerprintRequest } from '../src/fingerprint.js';
import { type MemoryStore, memoryStore } from '../src/memory-store.js';
import { mintKey } from '../src/mint.js';
import type { Store, StoredResponse } from '../src/store.js';
import type { TransactionalStore } from '../src/transactional.js';

const ok = (body = '{"id":"ch_1"}', status = 201): StoredResponse => ({
  status,
  headers: { 'content-type': 'application/json' },
  body: new TextEncoder().encode(body),
});

function setup(options: Partial<IdempotencyOptions> = {}) {
  const clock = { now: 1_700_000_000_000 };
  const store = memoryStore({ now: () => clock.now });
  const events: IdempotencyEvent[] = [];
  const engine = createIdempotency({
    store,
    heartbeat: false,
    now: () => clock.now,
    onEvent: (event) => events.push(event),
    ...options,
  });
  const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: 'fp-a' };
  return { clock, store, engine, events, request };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('spec part 3: the key state machine', () => {
  it('unseen → in progress: the first request executes', async () => {
    const { engine, request, events } = setup();
    const started = await engine.begin(request);
    expect(started.kind).toBe('execute');
    expect(events.map((e) => e.type)).toEqual(['claim']);
  });

  it('in progress + same key: 409 with Retry-After, nothing executed', async () => {
    const { engine, request } = setup();
    await engine.begin(request);
    const second = await engine.begin(request);
    expect(second.kind).toBe('reject');
    if (second.kind !== 'reject') return;
    expect(second.error.code).toBe('in_progress');
    expect(second.error.status).toBe(409);
    expect(second.error.retryAfter).toBe(1);
    expect(second.error.retryable).toBe(true);
  });

  it('in progress → completed: the response is stored; completed + same key replays it, nothing executed', async () => {
    const { engine, request, events } = setup();
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    expect(await engine.complete(first.lease, ok())).toEqual({ ok: true, stored: true });
    const again = await engine.begin(request);
    expect(again.kind).toBe('replay');
    if (again.kind !== 'replay') return;
    expect(again.response.status).toBe(201);
    expect(new TextDecoder().decode(again.response.body)).toBe('{"id":"ch_1"}');
    expect(events.map((e) => e.type)).toEqual(['claim', 'complete', 'replay']);
  });

  it('completed + retention expires → unseen: the key executes fresh', async () => {
    const { engine, request, clock } = setup();
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(first.lease, ok());
    clock.now += 24 * 3_600_000 - 1;
    expect((await engine.begin(request)).kind).toBe('replay');
    clock.now += 1;
    expect((await engine.begin(request)).kind).toBe('execute');
  });

  it('rule 1: of 50 simultaneous requests exactly one executes; the others get 409 or, once done, the replay', async () => {
    const { engine, request } = setup();
    let executions = 0;
    const results = await Promise.all(
      Array.from({ length: 50 }, async () => {
        const started = await engine.begin(request);
        if (started.kind === 'execute') {
          executions++;
          await engine.complete(started.lease, ok());
        }
        return started.kind === 'reject' ? started.error.code : started.kind;
      }),
    );
    expect(executions).toBe(1);
    expect(results.filter((r) => r === 'execute')).toHaveLength(1);
    expect(results.every((r) => r === 'execute' || r === 'in_progress' || r === 'replay')).toBe(true);
  });

  it('rule 1, wait mode: losers wait for the winner and all get its stored response', async () => {
    const clockless = memoryStore();
    const engine = createIdempotency({ store: clockless, wait: '5s', heartbeat: false });
    const request = { key: 'k', scope: 's', operation: 'POST /charges', fingerprint: 'fp' };
    let executions = 0;
    const results = await Promise.all(
      Array.from({ length: 20 }, async (_, i) => {
        const started = await engine.begin(request);
        if (started.kind === 'execute') {
          executions++;
          await new Promise((resolve) => setTimeout(resolve, 30));
          await engine.complete(started.lease, ok(`{"n":${i}}`));
          return 'execute';
        }
        return started.kind === 'replay' ? new TextDecoder().decode(started.response.body) : started.kind;
      }),
    );
    expect(executions).toBe(1);
    const winner = results.indexOf('execute');
    expect(results.filter((r) => r === `{"n":${winner}}`)).toHaveLength(19);
  });

  it('rule 2: same key with different parameters is rejected (422) and never executed', async () => {
    const { engine, request, events } = setup();
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(first.lease, ok());
    const other = await engine.begin({ ...request, fingerprint: 'fp-b' });
    expect(other.kind).toBe('reject');
    if (other.kind !== 'reject') return;
    expect(other.error.code).toBe('fingerprint_mismatch');
    expect(other.error.status).toBe(422);
    expect(other.error.toProblem()).toMatchObject({
      status: 422,
      type: 'https://idem.dev/problems/fingerprint-mismatch',
    });
    expect(events.at(-1)?.type).toBe('mismatch');
  });

  it('rule 2 with mismatchStatus 400: error type idempotency_error', async () => {
    const { engine, request } = setup({ mismatchStatus: 400 });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(first.lease, ok());
    const other = await engine.begin({ ...request, fingerprint: 'fp-b' });
    if (other.kind !== 'reject') throw new Error('expected reject');
    expect(other.error.code).toBe('idempotency_error');
    expect(other.error.status).toBe(400);
  });

  it('rule 3: a server-minted key runs once and replays on the retry that carries it', async () => {
    const { engine, request } = setup();
    const key = mintKey();
    expect(key).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(mintKey()).not.toBe(key);
    const first = await engine.begin({ ...request, key });
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(first.lease, ok());
    expect((await engine.begin({ ...request, key })).kind).toBe('replay');
  });
});

describe('anchor cases at engine level', () => {
  it('case 2: different bodies at once → one run; the other gets 409 in flight, 422 after', async () => {
    const { engine, request } = setup();
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    const during = await engine.begin({ ...request, fingerprint: 'fp-b' });
    expect(during.kind === 'reject' && during.error.code).toBe('in_progress');
    await engine.complete(first.lease, ok());
    const after = await engine.begin({ ...request, fingerprint: 'fp-b' });
    expect(after.kind === 'reject' && after.error.code).toBe('fingerprint_mismatch');
  });

  it('case 4: a loser whose winner record vanished before it could read it retries the claim, never throws', async () => {
    const inner = memoryStore();
    let firstClaim = true;
    // A store that reports "taken" once, then shows the record gone, as when the winner's lease
    // expired between the two calls.
    const store: Store = {
      ...inner,
      claim: async (input) => {
        if (firstClaim) {
          firstClaim = false;
          return { claimed: false, record: { state: 'in_progress', token: 'ghost', fingerprint: '' } };
        }
        return inner.claim(input);
      },
      get: (id) => inner.get(id),
    };
    const waiting = createIdempotency({ store, wait: '2s', heartbeat: false });
    expect((await waiting.begin({ key: 'k', scope: 's', operation: 'op' })).kind).toBe('execute');
    firstClaim = true;
    const immediate = createIdempotency({ store, heartbeat: false });
    const result = await immediate.begin({ key: 'k2', scope: 's', operation: 'op' });
    expect(result.kind === 'reject' && result.error.code).toBe('in_progress');
  });

  it('case 6, wait mode: the waiters of one key share one poll loop, so store reads do not grow with them', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    let gets = 0;
    const store: Store = {
      ...inner,
      get: (id) => {
        gets++;
        return inner.get(id);
      },
    };
    const engine = createIdempotency({ store, wait: '5s', heartbeat: false, now: () => Date.now() });
    const request = { key: 'k', scope: 's', operation: 'POST /charges', fingerprint: 'fp' };
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    const waiters = Array.from({ length: 50 }, () => engine.begin(request));
    await vi.advanceTimersByTimeAsync(1_000);
    // One loop reads after 10, 20, 40, 80, 160, then every 250 ms: eight reads in this second,
    // however many requests wait. A loop per waiter would make 50 times as many.
    expect(gets).toBeGreaterThan(0);
    expect(gets).toBeLessThanOrEqual(10);
    await engine.complete(first.lease, ok('{"winner":true}'));
    await vi.advanceTimersByTimeAsync(300);
    const results = await Promise.all(waiters);
    expect(results.map((result) => result.kind)).toEqual(Array(50).fill('replay'));
    expect(gets).toBeLessThanOrEqual(12);
  });

  it('case 7: an abandoned lease (crashed worker) frees the key after one lease, not after retention', async () => {
    const { engine, request, clock } = setup({ lease: '5s' });
    expect((await engine.begin(request)).kind).toBe('execute'); // the worker dies holding it
    clock.now += 4_999;
    expect((await engine.begin(request)).kind).toBe('reject');
    clock.now += 1;
    expect((await engine.begin(request)).kind).toBe('execute');
  });

  it('case 8 and 31: a handler running past its lease keeps ownership through the heartbeat', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    // A retention of 2 s, shorter than the handler's run (case 31): counted from the claim, it would
    // end while the handler still works. It starts at completion; in flight only the lease counts.
    const retention = { retention: '2s', acknowledgeShortRetention: true } as const;
    const engine = createIdempotency({ store, lease: '1s', ...retention, now: () => Date.now() });
    const request = { key: 'k', scope: 's', operation: 'op', fingerprint: '' };
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    // Ten leases, and five retentions, pass while the handler is still running.
    for (let i = 0; i < 30; i++) await vi.advanceTimersByTimeAsync(350);
    expect(first.lease.lost).toBe(false);
    const second = await engine.begin(request);
    expect(second.kind === 'reject' && second.error.code).toBe('in_progress');
    // The store agrees: a second engine (another process) cannot claim it either.
    const other = createIdempotency({ store, heartbeat: false, ...retention, now: () => Date.now() });
    expect((await other.begin(request)).kind).toBe('reject');
    expect(await engine.complete(first.lease, ok())).toEqual({ ok: true, stored: true });
    expect((await other.begin(request)).kind).toBe('replay');
    // The retention runs from the completion: replayed until it ends, then the key is free.
    await vi.advanceTimersByTimeAsync(1_999);
    expect((await other.begin(request)).kind).toBe('replay');
    await vi.advanceTimersByTimeAsync(1);
    expect((await other.begin(request)).kind).toBe('execute');
  });

  it('case 9: after a takeover, the old owner cannot complete or release; the event says so', async () => {
    const { engine, request, clock, events } = setup({ lease: '1s' });
    const old = await engine.begin(request);
    if (old.kind !== 'execute') throw new Error('expected execute');
    clock.now += 1_000;
    const taker = await engine.begin(request);
    if (taker.kind !== 'execute') throw new Error('expected takeover');
    expect(await engine.complete(old.lease, ok('{"late":true}'))).toEqual({ ok: false, reason: 'lease-lost' });
    expect(old.lease.lost).toBe(true);
    expect(old.lease.signal.aborted).toBe(true);
    expect(events.some((e) => e.type === 'lease-lost')).toBe(true);
    expect(await engine.release(old.lease)).toEqual({ ok: false, reason: 'lease-lost' });
    await engine.complete(taker.lease, ok('{"winner":true}'));
    const replay = await engine.begin(request);
    expect(replay.kind === 'replay' && new TextDecoder().decode(replay.response.body)).toBe('{"winner":true}');
  });

  it('case 9: a lease whose renewal is refused is marked lost and its signal aborts', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now() });
    const started = await engine.begin({ key: 'k', scope: 's', operation: 'op' });
    if (started.kind !== 'execute') throw new Error('expected execute');
    // Someone else's release or takeover: the record's token changes under us.
    await store.release({ id: started.lease.id, token: started.lease.token });
    await store.claim({ id: started.lease.id, token: 'intruder', fingerprint: '', leaseMs: 60_000 });
    await vi.advanceTimersByTimeAsync(600);
    expect(started.lease.lost).toBe(true);
    expect(started.lease.signal.aborted).toBe(true);
  });

  it('case 10: a thrown handler ends released or stored per policy, never stuck in progress', async () => {
    const stored = setup({ storeOutcome: 'all' });
    const a = await stored.engine.begin(stored.request);
    if (a.kind !== 'execute') throw new Error('expected execute');
    expect(await stored.engine.complete(a.lease, ok('{"error":"boom"}', 500), { thrown: true })).toEqual({
      ok: true,
      stored: true,
    });
    expect((await stored.engine.begin(stored.request)).kind).toBe('replay');

    const released = setup({ storeOutcome: 'success' });
    const b = await released.engine.begin(released.request);
    if (b.kind !== 'execute') throw new Error('expected execute');
    expect(await released.engine.complete(b.lease, ok('{"error":"boom"}', 500), { thrown: true })).toEqual({
      ok: true,
      stored: false,
    });
    expect((await released.engine.begin(released.request)).kind).toBe('execute');
  });

  it('case 13: when storing the outcome fails, the key is released and a store-error is reported', async () => {
    const inner = memoryStore();
    const store: Store = { ...inner, complete: async () => Promise.reject(new Error('connection reset')) };
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, heartbeat: false, onEvent: (e) => events.push(e) });
    const request = { key: 'k', scope: 's', operation: 'op' };
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    const result = await engine.complete(started.lease, ok());
    expect(result.ok).toBe(false);
    expect(result.ok === false && result.reason).toBe('store-error');
    expect(events.some((e) => e.type === 'store-error' && e.phase === 'complete')).toBe(true);
    expect(await inner.get(started.lease.id)).toBeUndefined();
  });

  it('case 14: a store that is down or hangs gives store_unavailable (503 + Retry-After), within the timeout', async () => {
    const down: Store = { ...memoryStore(), claim: async () => Promise.reject(new Error('ECONNREFUSED')) };
    const engine = createIdempotency({ store: down });
    const result = await engine.begin({ key: 'k', scope: 's', operation: 'op' });
    if (result.kind !== 'reject') throw new Error('expected reject');
    expect(result.error.code).toBe('store_unavailable');
    expect(result.error.status).toBe(503);
    expect(result.error.retryAfter).toBe(2);

    vi.useFakeTimers();
    const hung: Store = { ...memoryStore(), inProcess: false, claim: () => new Promise(() => undefined) };
    const slow = createIdempotency({ store: hung, storeTimeout: '500ms' });
    const pending = slow.begin({ key: 'k', scope: 's', operation: 'op' });
    // The deadline sweeper may fire up to a quarter of the limit late, never early.
    await vi.advanceTimersByTimeAsync(499);
    let settled = false;
    void pending.then(() => {
      settled = true;
    });
    await vi.advanceTimersByTimeAsync(0);
    expect(settled).toBe(false);
    await vi.advanceTimersByTimeAsync(130);
    const timedOut = await pending;
    expect(timedOut.kind === 'reject' && timedOut.error.code).toBe('store_unavailable');
  });

  it('case 15-17 and 19: the fingerprint ignores JSON key order and whitespace and excluded fields, not the query', () => {
    const base = { method: 'POST', route: '/charges', path: '/charges', contentType: 'application/json' };
    const a = fingerprintRequest({ ...base, body: '{"amount":100,"currency":"eur"}' });
    expect(fingerprintRequest({ ...base, body: '{ "currency" : "eur",\n "amount": 100 }' })).toBe(a);
    expect(fingerprintRequest({ ...base, body: '{"amount":101,"currency":"eur"}' })).not.toBe(a);
    expect(fingerprintRequest({ ...base, query: 'dryRun=true', body: '{"amount":100,"currency":"eur"}' })).not.toBe(a);
    const withTime = fingerprintRequest({ ...base, body: '{"amount":100,"sentAt":1}' }, { exclude: ['/sentAt'] });
    expect(fingerprintRequest({ ...base, body: '{"sentAt":2,"amount":100}' }, { exclude: ['/sentAt'] })).toBe(withTime);
  });

  it('case 16-17: a different body or query under the same key is refused, never replayed', async () => {
    const { engine } = setup();
    const base = {
      method: 'POST',
      route: '/charges',
      path: '/charges',
      contentType: 'application/json',
      body: '{"a":1}',
    };
    const request = { key: 'k', scope: 's', operation: 'POST /charges' };
    const first = await engine.begin({
      ...request,
      fingerprint: fingerprintRequest({ ...base, query: 'dryRun=true' }),
    });
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(first.lease, ok());
    const other = await engine.begin({
      ...request,
      fingerprint: fingerprintRequest({ ...base, query: 'dryRun=false' }),
    });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
  });

  it('case 18 and 21: another operation or another caller with the same key is an independent record', async () => {
    const { engine, request } = setup();
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(first.lease, ok('{"owner":"alice"}'));
    const bob = await engine.begin({ ...request, scope: 'user:bob' });
    expect(bob.kind).toBe('execute'); // never alice's stored response
    const otherRoute = await engine.begin({ ...request, operation: 'POST /refunds' });
    expect(otherRoute.kind).toBe('execute');
  });

  it('case 22: keys with separators and newlines never collide across scopes or operations', async () => {
    const { engine } = setup();
    const pairs = [
      { scope: 'a:b', operation: 'c', key: 'd' },
      { scope: 'a', operation: 'b:c', key: 'd' },
      { scope: 'a', operation: 'b', key: 'c:d' },
      { scope: 'a', operation: 'b', key: 'c\nd' },
      { scope: 'a', operation: 'b', key: 'c%0Ad' },
      { scope: 'a', operation: 'b', key: 'c/d' },
    ];
    for (const pair of pairs) expect((await engine.begin(pair)).kind).toBe('execute');
  });

  it('case 30: after the retention a key runs fresh', async () => {
    const { engine, request, clock } = setup({ retention: '48h' });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(first.lease, ok());
    clock.now += 47 * 3_600_000;
    expect((await engine.begin(request)).kind).toBe('replay');
    clock.now += 3_600_000;
    expect((await engine.begin(request)).kind).toBe('execute');
  });

  it('case 32: a per-outcome retention is honoured (5xx kept 1 h, 2xx the full day)', async () => {
    const { engine, clock } = setup({
      storeOutcome: ({ status }) => (status >= 500 ? { store: true, retention: '1h' } : true),
    });
    const failing = { key: 'k5', scope: 's', operation: 'op' };
    const fine = { key: 'k2', scope: 's', operation: 'op' };
    for (const [request, status] of [
      [failing, 502],
      [fine, 201],
    ] as const) {
      const started = await engine.begin(request);
      if (started.kind !== 'execute') throw new Error('expected execute');
      await engine.complete(started.lease, ok('{}', status));
    }
    clock.now += 3_600_000;
    expect((await engine.begin(failing)).kind).toBe('execute');
    expect((await engine.begin(fine)).kind).toBe('replay');
  });

  it('a policy function sees the operation of the lease, which complete() cannot override', async () => {
    const seen: unknown[] = [];
    const { engine } = setup({
      storeOutcome: (outcome) => {
        seen.push(outcome);
        return true;
      },
    });
    const started = await engine.begin({ key: 'k', scope: 's', operation: 'POST /payouts' });
    if (started.kind !== 'execute') throw new Error('expected execute');
    await engine.complete(started.lease, ok('{}', 201), { thrown: false, operation: 'POST /elsewhere' });
    expect(seen).toEqual([{ status: 201, thrown: false, operation: 'POST /payouts' }]);
  });

  it('case 33: expiry follows the store clock, not a skewed application clock', async () => {
    let storeNow = 0;
    const store = memoryStore({ now: () => storeNow });
    // This node's clock is an hour ahead of everyone else's.
    const skewed = createIdempotency({ store, heartbeat: false, lease: '5s', now: () => storeNow + 3_600_000 });
    const request = { key: 'k', scope: 's', operation: 'op' };
    expect((await skewed.begin(request)).kind).toBe('execute');
    storeNow += 4_000;
    const fresh = createIdempotency({ store, heartbeat: false, lease: '5s', now: () => storeNow });
    expect((await fresh.begin(request)).kind).toBe('reject');
  });

  it('storeOutcome presets: 401 and 429 are never stored by default; stripe keeps 500s', async () => {
    for (const [policy, status, stored] of [
      ['all', 401, false],
      ['all', 429, false],
      ['all', 500, true],
      ['all', 404, true],
      ['success', 404, false],
      ['stripe', 500, true],
      ['stripe', 429, false],
      ['stripe', 401, false],
      ['success', 401, false],
      ['success', 429, false],
    ] as const) {
      const { engine, request } = setup({ storeOutcome: policy });
      const started = await engine.begin(request);
      if (started.kind !== 'execute') throw new Error('expected execute');
      expect(await engine.complete(started.lease, ok('{}', status))).toEqual({ ok: true, stored });
    }
  });

  it('a storeOutcome function that throws or decides nothing stores the outcome and reports it, never leaving the key in progress', async () => {
    for (const policy of [
      () => {
        throw new Error('policy bug');
      },
      () => ({ store: true, retention: 'forever' }) as never,
      () => ({ store: true, retention: '99999d' }) as never,
      () => ({ store: true, retention: 0 }) as never,
      () => undefined as never,
    ]) {
      const { engine, request, events } = setup({ storeOutcome: policy });
      const started = await engine.begin(request);
      if (started.kind !== 'execute') throw new Error('expected execute');
      expect(await engine.complete(started.lease, ok('{}', 201))).toEqual({ ok: true, stored: true });
      expect(events.map((event) => event.type)).toEqual(['claim', 'policy-error', 'complete']);
      expect((await engine.begin(request)).kind).toBe('replay');
      // In a transaction too: the outcome commits with the handler's writes.
      const inTx = setup({ storeOutcome: policy, store: transactionalMemoryStore() });
      const again = await inTx.engine.begin(inTx.request);
      if (again.kind !== 'execute') throw new Error('expected execute');
      const result = await inTx.engine.transaction(again.lease, async () => ({ value: 1, response: ok('{}', 201) }));
      expect(result).toEqual({ committed: true, value: 1, stored: true });
      expect(inTx.events.map((event) => event.type)).toContain('policy-error');
    }
  });

  it('a storeOutcome retention out of range is a policy-error: the outcome is stored with the engine retention, not the one decided', async () => {
    // A memory store that records the retention each completion is given.
    const recording = () => {
      const inner = memoryStore();
      const retentions: number[] = [];
      const store: MemoryStore = {
        get size() {
          return inner.size;
        },
        get evicted() {
          return inner.evicted;
        },
        get bytes() {
          return inner.bytes;
        },
        claim: (input) => inner.claim(input),
        renew: (input) => inner.renew(input),
        release: (input) => inner.release(input),
        forget: (input) => inner.forget(input),
        get: (id) => inner.get(id),
        complete: (input) => {
          retentions.push(input.retentionMs);
          return inner.complete(input);
        },
      };
      return { store, retentions };
    };
    for (const retention of [undefined, '48h'] as const) {
      for (const [decided, policyError] of [
        ['99999d', true],
        [0, true],
        ['2h', false],
      ] as const) {
        const label = `engine ${retention ?? 'default'}, policy ${decided}`;
        const policy = () => ({ store: true as const, retention: decided });
        const plain = recording();
        const { engine, request, events } = setup({
          store: plain.store,
          storeOutcome: policy,
          ...(retention ? { retention } : {}),
        });
        // What the engine stores with when a policy decides nothing usable: 24h unless set.
        const fallback = retention ? 48 * 3_600_000 : 24 * 3_600_000;
        expect(engine.settings.retentionMs, label).toBe(fallback);
        const expected = policyError ? fallback : 2 * 3_600_000;
        const started = await engine.begin(request);
        if (started.kind !== 'execute') throw new Error('expected execute');
        expect(await engine.complete(started.lease, ok('{}', 201)), label).toEqual({ ok: true, stored: true });
        expect(
          events.some((event) => event.type === 'policy-error'),
          label,
        ).toBe(policyError);
        expect(plain.retentions, label).toEqual([expected]);
        // In a transaction, the completion that commits with the handler's writes gets the same.
        const inTx = recording();
        const tx = setup({
          store: transactionalMemoryStore({ store: inTx.store }),
          storeOutcome: policy,
          ...(retention ? { retention } : {}),
        });
        const again = await tx.engine.begin(tx.request);
        if (again.kind !== 'execute') throw new Error('expected execute');
        const result = await tx.engine.transaction(again.lease, async () => ({ value: 1, response: ok('{}', 201) }));
        expect(result, label).toEqual({ committed: true, value: 1, stored: true });
        expect(
          tx.events.some((event) => event.type === 'policy-error'),
          label,
        ).toBe(policyError);
        expect(inTx.retentions, label).toEqual([expected]);
      }
    }
  });
});

describe('a crashed attempt: its lease ran out with nobody renewing it', () => {
  // Spec part 3, rule 2: a key seen with different parameters is refused and never executed. The
  // crashed attempt may have done part of its work, so its parameters are kept as a finished one's.
  it('refuses other parameters for the retention, and lets the same ones take the key over', async () => {
    const { engine, request, clock, events } = setup({ lease: '5s', retention: '24h' });
    const crashed = await engine.begin(request);
    if (crashed.kind !== 'execute') throw new Error('expected execute');
    expect(crashed.lease.recovered).toBe(false);
    clock.now += 5_000;
    const other = await engine.begin({ ...request, fingerprint: 'fp-other' });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
    expect(events.at(-1)).toMatchObject({ type: 'mismatch', id: crashed.lease.id });
    // Still refused late in the retention, and without any claim having been made for it.
    clock.now += 86_400_000 - 1;
    expect((await engine.begin({ ...request, fingerprint: 'fp-other' })).kind).toBe('reject');
    expect(events.filter((event) => event.type === 'claim')).toHaveLength(1);
    const retry = await engine.begin(request);
    if (retry.kind !== 'execute') throw new Error('expected execute');
    expect(retry.lease.recovered).toBe(true);
    expect(events.at(-1)).toMatchObject({ type: 'claim', recovered: true });
    // The crashed attempt's token is fenced: only the retry's outcome is stored.
    expect(await engine.complete(crashed.lease, ok('{"late":true}'))).toEqual({ ok: false, reason: 'lease-lost' });
    expect(await engine.complete(retry.lease, ok('{"retry":true}'))).toEqual({ ok: true, stored: true });
    const replay = await engine.begin(request);
    expect(replay.kind === 'replay' && new TextDecoder().decode(replay.response.body)).toBe('{"retry":true}');
  });

  it('forgets the key once the retention after the lease has passed', async () => {
    const { engine, request, clock } = setup({ lease: '5s', retention: '2d' });
    expect((await engine.begin(request)).kind).toBe('execute');
    clock.now += 5_000 + 2 * 86_400_000 - 1;
    expect((await engine.begin({ ...request, fingerprint: 'fp-other' })).kind).toBe('reject');
    clock.now += 1;
    const fresh = await engine.begin({ ...request, fingerprint: 'fp-other' });
    expect(fresh.kind === 'execute' && fresh.lease.recovered).toBe(false);
  });

  it('answers the 400 idempotency_error under mismatchStatus: 400', async () => {
    const { engine, request, clock } = setup({ lease: '5s', mismatchStatus: 400 });
    expect((await engine.begin(request)).kind).toBe('execute');
    clock.now += 5_000;
    const other = await engine.begin({ ...request, fingerprint: 'fp-other' });
    expect(other.kind === 'reject' && [other.error.code, other.error.status]).toEqual(['idempotency_error', 400]);
  });

  it('a request without a fingerprint takes the key over, as it would replay a finished one', async () => {
    const { engine, request, clock } = setup({ lease: '5s' });
    expect((await engine.begin(request)).kind).toBe('execute');
    clock.now += 5_000;
    const retry = await engine.begin({ ...request, fingerprint: '' });
    expect(retry.kind === 'execute' && retry.lease.recovered).toBe(true);
  });

  it('a waiter whose holder stops renewing takes the key over, or is refused for other parameters', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const crashing = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', wait: '5s', heartbeat: false, now: () => Date.now() });
    const request = { key: 'k', scope: 's', operation: 'POST /charges', fingerprint: 'fp' };
    expect((await crashing.begin(request)).kind).toBe('execute');
    const same = engine.begin(request);
    const different = engine.begin({ ...request, key: 'k', fingerprint: 'fp-other' });
    await vi.advanceTimersByTimeAsync(1_300);
    const [sameResult, differentResult] = await Promise.all([same, different]);
    // One of the two waiters saw the abandoned record first; the other then saw it taken over (a
    // live lease: 409 once its wait is over) or abandoned. Either way only the same parameters run.
    expect(sameResult.kind === 'execute' && sameResult.lease.recovered).toBe(true);
    expect(differentResult.kind === 'reject' && differentResult.error.code).toMatch(
      /^(fingerprint_mismatch|in_progress)$/,
    );
  });

  it('a store that ignores `replaces` gets a 409, not a claim loop', async () => {
    const clock = { now: 0 };
    const inner = memoryStore({ now: () => clock.now });
    let claims = 0;
    const store: Store = {
      ...inner,
      inProcess: true,
      claim: ({ replaces: _ignored, ...input }) => {
        claims++;
        return inner.claim(input);
      },
    };
    const engine = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => clock.now });
    const request = { key: 'k', scope: 's', operation: 'POST /charges', fingerprint: 'fp' };
    expect((await engine.begin(request)).kind).toBe('execute');
    clock.now += 1_000;
    const retry = await engine.begin(request);
    expect(retry.kind === 'reject' && retry.error.code).toBe('in_progress');
    expect(claims).toBe(3);
  });
});

describe('options are checked once, at construction', () => {
  const store = memoryStore();
  it.each([
    [{ store, retention: '1h' }, /acknowledgeShortRetention/],
    [{ store, retention: 'a day' }, /retention/],
    [{ store, lease: 10 }, /lease/],
    // Past what stores and timers take: a Redis PX of 1e+21, a heartbeat running every millisecond.
    [{ store, retention: '3651d' }, /retention must be at most 3650d/],
    [{ store, retention: 1e21 }, /retention must be at most 3650d/],
    [{ store, lease: '8d' }, /lease must be at most 7d/],
    [{ store, mismatchStatus: 409 as 422 }, /mismatchStatus/],
    [{ store, storeOutcome: 'some' as 'all' }, /storeOutcome/],
    [{ store: {} as Store }, /Store contract/],
    [{ store, conflictRetryAfter: '1s' as unknown as number }, /conflictRetryAfter must be a whole number of seconds/],
    [{ store, unavailableRetryAfter: 1.5 }, /unavailableRetryAfter must be a whole number of seconds/],
    [{ store, unavailableRetryAfter: -1 }, /unavailableRetryAfter/],
  ])('%# rejects a bad option with a TypeError', (options, message) => {
    expect(() => createIdempotency(options as IdempotencyOptions)).toThrow(message);
  });

  it('accepts a short retention when acknowledged', () => {
    expect(createIdempotency({ store, retention: '1h', acknowledgeShortRetention: true }).settings.retentionMs).toBe(
      3_600_000,
    );
  });

  it('refuses misuse of begin with a TypeError', async () => {
    const engine = createIdempotency({ store });
    await expect(engine.begin({ key: '', scope: 's', operation: 'op' })).rejects.toThrow(TypeError);
  });
});

describe('heartbeat and completion racing', () => {
  it('a renewal still in flight when the outcome is stored does not report a lost lease', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    let releaseRenew: (() => void) | undefined;
    // A store whose renewals hang until the test lets them go, so one is in flight during complete.
    const store: Store = {
      ...inner,
      inProcess: false,
      renew: (input) =>
        new Promise((resolve) => {
          releaseRenew = () => resolve(inner.renew(input));
        }),
    };
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const started = await engine.begin({ key: 'k', scope: 's', operation: 'op' });
    if (started.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(600);
    expect(releaseRenew).toBeDefined();
    expect(await engine.complete(started.lease, ok())).toEqual({ ok: true, stored: true });
    releaseRenew?.();
    await vi.advanceTimersByTimeAsync(10);
    expect(events.some((e) => e.type === 'lease-lost')).toBe(false);
    expect(started.lease.lost).toBe(false);
  });
});

describe('a failed completion answers within one store timeout', () => {
  it('does not wait for the follow-up release when the store is failing', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    // The store hangs on everything after the claim: complete times out, and so would the release.
    const store: Store = {
      ...inner,
      inProcess: false,
      complete: () => new Promise(() => undefined),
      release: () => new Promise(() => undefined),
    };
    const engine = createIdempotency({ store, heartbeat: false, storeTimeout: '1s', now: () => Date.now() });
    const started = await engine.begin({ key: 'k', scope: 's', operation: 'op' });
    if (started.kind !== 'execute') throw new Error('expected execute');
    let result: unknown;
    void engine.complete(started.lease, ok()).then((r) => {
      result = r;
    });
    // One timeout (plus the sweeper's quarter) and the caller has its answer, not two.
    await vi.advanceTimersByTimeAsync(1_300);
    expect(result).toMatchObject({ ok: false, reason: 'store-error' });
  });
});

describe('stores that answer synchronously', () => {
  const base = { scope: 'user:1', operation: 'POST /charges', fingerprint: 'fp' };

  it('a synchronous store works in or out of process, and a synchronous throw is a 503, never an exception', async () => {
    for (const inProcess of [true, false]) {
      const inner = memoryStore();
      let down = false;
      // Every method answers with a plain value, and fails by throwing, as the contract allows.
      const store: Store = {
        inProcess,
        claim: (input) => {
          if (down) throw new Error('store down');
          return inner.claim(input);
        },
        renew: (input) => inner.renew(input),
        complete: (input) => inner.complete(input),
        release: (input) => inner.release(input),
        get: (id) => inner.get(id),
      };
      const engine = createIdempotency({ store });
      const first = await engine.begin({ ...base, key: `sync-${inProcess}` });
      expect(first.kind).toBe('execute');
      if (first.kind !== 'execute') return;
      expect(await engine.complete(first.lease, ok())).toEqual({ ok: true, stored: true });
      const again = await engine.begin({ ...base, key: `sync-${inProcess}` });
      expect(again.kind).toBe('replay');
      down = true;
      const failed = await engine.begin({ ...base, key: `other-${inProcess}` });
      expect(failed.kind === 'reject' && failed.error.code).toBe('store_unavailable');
    }
  });

  it('two engines sharing one in-process store never hand out the same fencing token', async () => {
    const store = memoryStore();
    const engines = [createIdempotency({ store }), createIdempotency({ store })];
    const tokens = new Set<string>();
    for (let i = 0; i < 2_000; i++) {
      const started = await (engines[i % 2] as (typeof engines)[0]).begin({ ...base, key: `k-${i}` });
      if (started.kind !== 'execute') throw new Error(started.kind);
      tokens.add(started.lease.token);
      await (engines[i % 2] as (typeof engines)[0]).release(started.lease);
    }
    expect(tokens.size).toBe(2_000);
  });
});

describe('maxExecution: a hung handler does not hold its key for as long as the process lives', () => {
  const request = { key: 'k', scope: 's', operation: 'op', fingerprint: '' };

  it('without it, a handler that never settles keeps its key in progress', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now() });
    expect((await engine.begin(request)).kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(60_000);
    const other = createIdempotency({ store, heartbeat: false, now: () => Date.now() });
    expect((await other.begin(request)).kind).toBe('reject');
  });

  it('stops renewing at maxExecution: the lease is lost, its signal aborts, and a retry runs within one lease', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store,
      lease: '1s',
      maxExecution: '5s',
      now: () => Date.now(),
      onEvent: (e) => events.push(e),
    });
    const hung = await engine.begin(request);
    if (hung.kind !== 'execute') throw new Error('expected execute');
    const other = createIdempotency({ store, heartbeat: false, now: () => Date.now() });
    // Well past one lease but below maxExecution, the heartbeat still holds the key.
    await vi.advanceTimersByTimeAsync(4_500);
    expect(hung.lease.lost).toBe(false);
    expect((await other.begin(request)).kind).toBe('reject');
    // At maxExecution (give or take one heartbeat tick) the lease is given up.
    await vi.advanceTimersByTimeAsync(750);
    expect(hung.lease.lost).toBe(true);
    expect(hung.lease.signal.aborted).toBe(true);
    expect(events.filter((e) => e.type === 'lease-lost')).toEqual([
      expect.objectContaining({ type: 'lease-lost', reason: 'max-execution', operation: 'op' }),
    ]);
    // Within one lease more the store has let it go, and a retry executes.
    await vi.advanceTimersByTimeAsync(1_000);
    const retry = await other.begin(request);
    expect(retry.kind).toBe('execute');
    if (retry.kind !== 'execute') return;
    await other.complete(retry.lease, ok('{"retry":true}'));
    // The hung handler finally answers: fenced, the retry's outcome stands.
    expect(await engine.complete(hung.lease, ok('{"late":true}'))).toEqual({ ok: false, reason: 'lease-lost' });
    const replay = await other.begin(request);
    expect(replay.kind === 'replay' && new TextDecoder().decode(replay.response.body)).toBe('{"retry":true}');
  });

  it('a handler that finishes within one lease after maxExecution still has its outcome stored', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', maxExecution: '2s', now: () => Date.now() });
    const slow = await engine.begin(request);
    if (slow.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(2_300);
    expect(slow.lease.lost).toBe(true);
    expect(await engine.complete(slow.lease, ok('{"slow":true}'))).toEqual({ ok: true, stored: true });
    const replay = await engine.begin(request);
    expect(replay.kind === 'replay' && new TextDecoder().decode(replay.response.body)).toBe('{"slow":true}');
  });

  it('a handler that finishes later than that, with nobody taking its key over, still has its outcome stored', async () => {
    // Its lease ran out, so the record is abandoned: a retry would have taken it over, other
    // parameters are refused, and the late outcome (the work is done) is the one kept.
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const engine = createIdempotency({ store, lease: '1s', maxExecution: '2s', now: () => Date.now() });
    const mine = { ...request, fingerprint: 'fp-slow' };
    const slow = await engine.begin(mine);
    if (slow.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(5_000);
    expect(slow.lease.lost).toBe(true);
    const other = await engine.begin({ ...request, fingerprint: 'other parameters' });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
    expect(await engine.complete(slow.lease, ok('{"slow":true}'))).toEqual({ ok: true, stored: true });
    const replay = await engine.begin(mine);
    expect(replay.kind === 'replay' && new TextDecoder().decode(replay.response.body)).toBe('{"slow":true}');
  });

  it('is validated: a duration of at least 100ms, with the heartbeat on', () => {
    const store = memoryStore();
    expect(() => createIdempotency({ store, maxExecution: '50ms' })).toThrow(/at least 100ms/);
    expect(() => createIdempotency({ store, maxExecution: 'soon' as never })).toThrow(TypeError);
    expect(() => createIdempotency({ store, maxExecution: '1m', heartbeat: false })).toThrow(/needs the heartbeat/);
    expect(createIdempotency({ store, maxExecution: '1m' }).settings.maxExecutionMs).toBe(60_000);
    expect(createIdempotency({ store, maxExecution: false }).settings.maxExecutionMs).toBe(0);
  });
});

describe('transaction and heartbeat racing', () => {
  it('no renewal runs once the handler has produced its outcome: a commit in flight is never reported as a lost lease', async () => {
    vi.useFakeTimers();
    let committing = false;
    let open: (() => void) | undefined;
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    const inner = transactionalMemoryStore({
      store: memoryStore({ now: () => Date.now() }),
      beforeCommit: async () => {
        committing = true;
        await gate;
      },
    });
    // As PostgreSQL does: a renewal sent while the completion holds the row waits for the commit,
    // then finds the record completed and answers false.
    const store = {
      ...inner,
      inProcess: false,
      renew: (input: Parameters<Store['renew']>[0]) => (committing ? Promise.resolve(false) : inner.renew(input)),
    };
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const started = await engine.begin({ key: 'k', scope: 's', operation: 'op' });
    if (started.kind !== 'execute') throw new Error('expected execute');
    const result = engine.transaction(started.lease, async () => ({ value: 1, response: ok() }));
    // A slow commit: heartbeat ticks pass while it is in flight (within the lease, which the row
    // lock would hold in PostgreSQL anyway).
    await vi.advanceTimersByTimeAsync(600);
    open?.();
    expect(await result).toEqual({ committed: true, value: 1, stored: true });
    expect(events.some((e) => e.type === 'lease-lost')).toBe(false);
    expect(started.lease.lost).toBe(false);
    expect(started.lease.signal.aborted).toBe(false);
  });
});

describe('a transaction that cannot begin', () => {
  it('is a store-error within storeTimeout, and runs nothing when the store begins it later', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    let beginLater: (() => Promise<unknown>) | undefined;
    // As a pool whose connections are all held: the store calls the handler only once one is free.
    const store: TransactionalStore<{ id: string }> = {
      claim: (input) => inner.claim(input),
      renew: (input) => inner.renew(input),
      complete: (input) => inner.complete(input),
      release: (input) => inner.release(input),
      get: (id) => inner.get(id),
      transaction: (input, fn) =>
        new Promise((resolve, reject) => {
          beginLater = () => {
            const produced = fn({ id: input.id });
            produced.then((done) => resolve({ committed: true, value: done.value }), reject);
            return produced;
          };
        }),
    };
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store,
      storeTimeout: '200ms',
      heartbeat: false,
      now: () => Date.now(),
      onEvent: (event) => events.push(event),
    });
    const request = { key: 'k', scope: 's', operation: 'op' };
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    let ran = false;
    const result = engine.transaction(started.lease, async () => {
      ran = true;
      return { value: 1, response: ok() };
    });
    await vi.advanceTimersByTimeAsync(300);
    expect(await result).toMatchObject({ committed: false, reason: 'store-error' });
    expect(events).toContainEqual(expect.objectContaining({ type: 'store-error', phase: 'transaction' }));
    // The key is free again for the retry.
    expect((await engine.begin(request)).kind).toBe('execute');
    await expect(beginLater?.()).rejects.toThrow('began after its caller gave up');
    expect(ran).toBe(false);
  });
});

describe('fingerprints reach the store as printable ASCII', () => {
  it('keeps hex fingerprints as given, and hashes any other so every store can hold and compare it', async () => {
    const { engine, store } = setup();
    const claimed: string[] = [];
    const claim = store.claim.bind(store);
    store.claim = (input) => {
      claimed.push(input.fingerprint);
      return claim(input);
    };
    const hex = 'a'.repeat(64);
    const fingerprints = [hex, 'body:\ud83d', 'body:\udc00', 'a\u0000b', 'café'];
    const kept: string[] = [];
    for (const [n, fingerprint] of fingerprints.entries()) {
      const request = { key: `k-${n}`, scope: 's', operation: 'POST /x', fingerprint };
      const started = await engine.begin(request);
      if (started.kind !== 'execute') throw new Error('expected an execution');
      kept.push(claimed.at(-1) as string);
      await engine.complete(started.lease, ok());
      // The very same request replays; another body is refused.
      expect((await engine.begin(request)).kind).toBe('replay');
      const other = await engine.begin({ ...request, fingerprint: `${fingerprint}x` });
      expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');
    }
    expect(kept[0]).toBe(hex);
    for (const stored of kept.slice(1)) expect(stored).toMatch(/^sha256:[0-9a-f]{64}$/);
    // Lone surrogates stay apart (JSON text), where UTF-8 would make both U+FFFD.
    expect(new Set(kept).size).toBe(kept.length);
  });

  it('refuses a fingerprint that is not a string', async () => {
    const { engine } = setup();
    await expect(
      engine.begin({ key: 'k', scope: 's', operation: 'POST /x', fingerprint: 7 as unknown as string }),
    ).rejects.toThrow(new TypeError('begin needs a string fingerprint, or none'));
  });
});

describe('option bounds are inclusive, as documented', () => {
  const store = memoryStore();

  it('accepts a retention of exactly 3650d, a lease of exactly 100ms and of exactly 7d, a maxExecution of exactly 100ms', () => {
    expect(createIdempotency({ store, retention: '3650d' }).settings.retentionMs).toBe(3650 * 86_400_000);
    expect(createIdempotency({ store, lease: 100 }).settings.leaseMs).toBe(100);
    expect(createIdempotency({ store, lease: '7d' }).settings.leaseMs).toBe(7 * 86_400_000);
    expect(createIdempotency({ store, maxExecution: '100ms' }).settings.maxExecutionMs).toBe(100);
  });

  it('stores with a per-outcome retention of exactly 3650d, without a policy-error', async () => {
    const {
      engine,
      store: inner,
      request,
      events,
    } = setup({ storeOutcome: () => ({ store: true, retention: '3650d' }) });
    const retentions: number[] = [];
    const complete = inner.complete.bind(inner);
    inner.complete = (input) => {
      retentions.push(input.retentionMs);
      return complete(input);
    };
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    expect(await engine.complete(started.lease, ok())).toEqual({ ok: true, stored: true });
    expect(retentions).toEqual([3650 * 86_400_000]);
    expect(events.map((event) => event.type)).toEqual(['claim', 'complete']);
  });
});

describe('misuse of begin throws a TypeError', () => {
  it('refuses a missing scope and an empty operation', async () => {
    const { engine } = setup();
    await expect(engine.begin({ key: 'k', scope: undefined as unknown as string, operation: 'op' })).rejects.toThrow(
      /needs a scope/,
    );
    await expect(engine.begin({ key: 'k', scope: 's', operation: '' })).rejects.toThrow(/needs an operation/);
  });
});

describe('storeOutcome decisions', () => {
  it('an outcome the policy drops, finished after a takeover, is reported as a lost lease, not as released', async () => {
    // The release that "not stored" means is fenced like a completion: the taker's claim stands.
    const { engine, request, clock } = setup({ lease: '1s', storeOutcome: 'success' });
    const old = await engine.begin(request);
    if (old.kind !== 'execute') throw new Error('expected execute');
    clock.now += 1_000;
    const taker = await engine.begin(request);
    if (taker.kind !== 'execute') throw new Error('expected takeover');
    expect(await engine.complete(old.lease, ok('{}', 500))).toEqual({ ok: false, reason: 'lease-lost' });
    const again = await engine.begin(request);
    expect(again.kind === 'reject' && again.error.code).toBe('in_progress');
  });
});

describe('events', () => {
  it("a complete event's executionMs runs from the claim, its durationMs from the completion call", async () => {
    const { engine, request, events, clock } = setup();
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    clock.now += 1_234; // the handler runs
    await engine.complete(started.lease, ok());
    expect(events.at(-1)).toMatchObject({ type: 'complete', status: 201, durationMs: 0, executionMs: 1_234 });
  });

  it('a lease that is lost is reported once, however many of its operations are fenced afterwards', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const started = await engine.begin({ key: 'k', scope: 's', operation: 'op' });
    if (started.kind !== 'execute') throw new Error('expected execute');
    // Another executor's claim replaces ours: the next renewal is refused.
    store.release({ id: started.lease.id, token: started.lease.token });
    store.claim({ id: started.lease.id, token: 'intruder', fingerprint: '', leaseMs: 60_000 });
    await vi.advanceTimersByTimeAsync(600);
    expect(started.lease.lost).toBe(true);
    // The late finisher is then fenced at completion and at release too: still one lost lease.
    expect(await engine.complete(started.lease, ok())).toEqual({ ok: false, reason: 'lease-lost' });
    expect(await engine.release(started.lease)).toEqual({ ok: false, reason: 'lease-lost' });
    expect(events.filter((e) => e.type === 'lease-lost')).toHaveLength(1);
  });

  it('a store_unavailable rejection carries the store failure as its cause', async () => {
    const failure = new Error('ECONNREFUSED');
    const store: Store = { ...memoryStore(), claim: () => Promise.reject(failure) };
    const result = await createIdempotency({ store }).begin({ key: 'k', scope: 's', operation: 'op' });
    if (result.kind !== 'reject') throw new Error('expected reject');
    expect(result.error.code).toBe('store_unavailable');
    expect(result.error.cause).toBe(failure);
  });
});

describe('the heartbeat', () => {
  const request = { key: 'k', scope: 's', operation: 'op' };

  it('with heartbeat: false nothing renews: the key is free after one lease even while the handler runs', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    let renewals = 0;
    const store: Store = {
      ...inner,
      renew: (input) => {
        renewals++;
        return inner.renew(input);
      },
    };
    const engine = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => Date.now() });
    expect((await engine.begin(request)).kind).toBe('execute');
    await vi.advanceTimersByTimeAsync(5_000);
    expect(renewals).toBe(0);
    const other = createIdempotency({ store, heartbeat: false, now: () => Date.now() });
    expect((await other.begin(request)).kind).toBe('execute');
  });

  it('a lease whose renewals fail for a whole lease is lost; failures within the lease are not', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    const store: Store = { ...inner, inProcess: false, renew: () => Promise.reject(new Error('ETIMEDOUT')) };
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(900);
    expect(events.some((e) => e.type === 'store-error' && e.phase === 'renew')).toBe(true);
    expect(started.lease.lost).toBe(false);
    await vi.advanceTimersByTimeAsync(200);
    expect(started.lease.lost).toBe(true);
    expect(started.lease.signal.aborted).toBe(true);
    expect(events.filter((e) => e.type === 'lease-lost')).toEqual([
      expect.objectContaining({ reason: 'renew-failed' }),
    ]);
  });

  it('sends one renewal at a time: a slow store is not sent another for the same lease until it answers', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    let renewals = 0;
    const store: Store = {
      ...inner,
      inProcess: false,
      renew: () => {
        renewals++;
        return new Promise<boolean>(() => undefined); // never answers
      },
    };
    const engine = createIdempotency({ store, lease: '1s', storeTimeout: '10s', now: () => Date.now() });
    expect((await engine.begin(request)).kind).toBe('execute');
    // Eight heartbeat ticks pass with the first renewal still in flight.
    await vi.advanceTimersByTimeAsync(2_000);
    expect(renewals).toBe(1);
  });

  it('a renewal that fails after the outcome was stored reports nothing', async () => {
    vi.useFakeTimers();
    const inner = memoryStore({ now: () => Date.now() });
    let failRenew: ((error: Error) => void) | undefined;
    const store: Store = {
      ...inner,
      inProcess: false,
      renew: () =>
        new Promise((_, reject) => {
          failRenew = reject;
        }),
    };
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, lease: '1s', now: () => Date.now(), onEvent: (e) => events.push(e) });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    await vi.advanceTimersByTimeAsync(600);
    expect(failRenew).toBeDefined();
    expect(await engine.complete(started.lease, ok())).toEqual({ ok: true, stored: true });
    failRenew?.(new Error('connection reset'));
    await vi.advanceTimersByTimeAsync(10);
    expect(events.map((e) => e.type)).toEqual(['claim', 'complete']);
  });
});

describe('a store out of process (the local hot path)', () => {
  it('case 7 holds there too: a lease not renewed frees the key at exactly one lease', async () => {
    const clock = { now: 1_700_000_000_000 };
    const store: Store = { ...memoryStore({ now: () => clock.now }), inProcess: false };
    const engine = createIdempotency({ store, lease: '1s', heartbeat: false, now: () => clock.now });
    const request = { key: 'k', scope: 's', operation: 'op' };
    expect((await engine.begin(request)).kind).toBe('execute'); // the handler stalls, nothing renews
    clock.now += 999;
    expect((await engine.begin(request)).kind).toBe('reject');
    clock.now += 1;
    expect((await engine.begin(request)).kind).toBe('execute');
  });
});

describe('wait mode', () => {
  const request = { key: 'k', scope: 's', operation: 'POST /charges', fingerprint: 'fp' };

  it('answers 409 once the wait is over while the first request still runs', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const engine = createIdempotency({ store, wait: '1s', heartbeat: false, now: () => Date.now() });
    expect((await engine.begin(request)).kind).toBe('execute'); // runs for longer than the wait
    let result: BeginResult | undefined;
    void engine.begin(request).then((r) => {
      result = r;
    });
    await vi.advanceTimersByTimeAsync(900);
    expect(result).toBeUndefined();
    await vi.advanceTimersByTimeAsync(200);
    expect(result?.kind === 'reject' && result.error.code).toBe('in_progress');
  });

  it('a waiter sees an outcome that lands late in its wait within a quarter second', async () => {
    vi.useFakeTimers();
    const store = memoryStore({ now: () => Date.now() });
    const engine = createIdempotency({ store, wait: '10s', heartbeat: false, now: () => Date.now() });
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected execute');
    let result: BeginResult | undefined;
    void engine.begin(request).then((r) => {
      result = r;
    });
    await vi.advanceTimersByTimeAsync(3_000);
    await engine.complete(first.lease, ok());
    await vi.advanceTimersByTimeAsync(260);
    expect(result?.kind).toBe('replay');
  });

  it('a store failure while waiting is a 503 with a store-error of phase get', async () => {
    const inner = memoryStore();
    const store: Store = { ...inner, get: () => Promise.reject(new Error('ECONNRESET')) };
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, wait: '1s', heartbeat: false, onEvent: (e) => events.push(e) });
    expect((await engine.begin(request)).kind).toBe('execute');
    const waiter = await engine.begin(request);
    expect(waiter.kind === 'reject' && waiter.error.code).toBe('store_unavailable');
    expect(events.at(-1)).toMatchObject({ type: 'store-error', phase: 'get' });
  });
});

describe('transactional mode', () => {
  it('a commit refused after a takeover marks the lease lost and reports it', async () => {
    const inner = memoryStore();
    const { engine, request, events } = setup({ store: transactionalMemoryStore({ store: inner }) });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    inner.release({ id: started.lease.id, token: started.lease.token });
    inner.claim({ id: started.lease.id, token: 'taker', fingerprint: '', leaseMs: 60_000 });
    const result = await engine.transaction(started.lease, async () => ({ value: 1, response: ok() }));
    expect(result).toEqual({ committed: false, reason: 'lease-lost' });
    expect(started.lease.lost).toBe(true);
    expect(started.lease.signal.aborted).toBe(true);
    expect(events.at(-1)).toMatchObject({ type: 'lease-lost', reason: 'fenced' });
  });

  it('a transaction the store fails has freed the key by the time it returns', async () => {
    const inner = memoryStore();
    // The store's release answers a moment later, as a network store's does.
    const store: TransactionalStore<unknown> = {
      claim: (input) => inner.claim(input),
      renew: (input) => inner.renew(input),
      complete: (input) => inner.complete(input),
      get: (id) => inner.get(id),
      release: async (input) => {
        await new Promise((resolve) => setTimeout(resolve, 5));
        return inner.release(input);
      },
      transaction: async () => Promise.reject(new Error('could not serialize access')),
    };
    const { engine, request } = setup({ store });
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('expected execute');
    const result = await engine.transaction(started.lease, async () => ({ value: 1, response: ok() }));
    expect(result).toMatchObject({ committed: false, reason: 'store-error' });
    expect((await engine.begin(request)).kind).toBe('execute');
  });
});
