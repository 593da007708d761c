// Audit (branch audit-deploy): a shared store answers a record this engine did not write. The engine
// checks every response before a store keeps it; it must check what a store gives back as well, for
// any store, since another version, a restore or a hand-rolled tool may have written it. The
// integration side (real Redis and PostgreSQL, three frameworks) is
// packages/testkit/test/unreadable-records.audit.int.test.ts.
import { describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyEvent } from '../src/events.js';
import { memoryStore } from '../src/memory-store.js';
import { unreadableRecord } from '../src/record-check.js';
import type { Store, StoreRecord } from '../src/store.js';

const body = new TextEncoder().encode('{"id":"ch_1"}');
const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint: '' };

// A store that answers every claim and read with `record`, as a store shared with a writer that is
// not this engine would.
const answering = (record: unknown): Store => {
  const store = memoryStore();
  return {
    ...store,
    inProcess: false,
    claim: async () => ({ claimed: false, record: record as StoreRecord }),
    get: async () => record as StoreRecord,
  } as Store;
};

const completed = (response: unknown) => ({ state: 'completed', token: 't', fingerprint: '', response });

describe('a record the store answers that no replay can give back', () => {
  // Was wrong: the engine replayed whatever a store answered. A status of 0 or 1000 made writeHead
  // throw (Express's and Koa's 500, Fastify closed the connection), 200.5 went out as 200, a header
  // value that is a number or an object went out as `5` or `[object Object]`, a line break threw.
  it.each([
    ['status 0', { status: 0, headers: {}, body }],
    ['status 1000', { status: 1000, headers: {}, body }],
    ['status 200.5', { status: 200.5, headers: {}, body }],
    ['headers a string', { status: 201, headers: 'content-type', body }],
    ['a header value a number', { status: 201, headers: { 'content-type': 5 }, body }],
    ['a header value an object', { status: 201, headers: { 'content-type': { a: 1 } }, body }],
    ['a header value with a line break', { status: 201, headers: { 'content-type': 'a\r\nset-cookie: x' }, body }],
    ['a body that is no bytes', { status: 201, headers: {}, body: '{"id":"ch_1"}' }],
  ])('%s: 503 store_unavailable and a store-error event, never a replay', async (_name, response) => {
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: answering(completed(response)),
      heartbeat: false,
      onEvent: (event) => events.push(event),
    });
    const started = await engine.begin(request);
    expect(started.kind === 'reject' && started.error.code).toBe('store_unavailable');
    expect(started.kind === 'reject' && started.error.retryAfter).toBe(2);
    expect(events.map((event) => event.type)).toEqual(['store-error']);
    expect(events[0]).toMatchObject({ phase: 'claim', error: { name: 'StoreUnavailableError' } });
  });

  it('a record in no state the engine knows, or without a fingerprint, is 503 too', async () => {
    for (const record of [
      { state: 'done', token: 't', fingerprint: '' },
      { state: 'in_progress', token: 't' },
      { state: 'completed', token: 't', response: { status: 201, headers: {}, body } },
    ]) {
      const started = await createIdempotency({ store: answering(record), heartbeat: false }).begin(request);
      expect(started.kind === 'reject' && started.error.code, JSON.stringify(record)).toBe('store_unavailable');
    }
  });

  it('found by a waiter (wait), it is a store-error of phase get, and the replay cache keeps none of it', async () => {
    const events: IdempotencyEvent[] = [];
    let reads = 0;
    const base = answering({ state: 'in_progress', token: 't', fingerprint: '' });
    const store: Store = {
      ...base,
      get: async () => {
        reads++;
        return completed({ status: 0, headers: {}, body }) as StoreRecord;
      },
    };
    const engine = createIdempotency({
      store,
      heartbeat: false,
      wait: '1s',
      replayCache: { ttl: '1m' },
      onEvent: (event) => events.push(event),
    });
    const started = await engine.begin(request);
    expect(started.kind === 'reject' && started.error.code).toBe('store_unavailable');
    expect(events.filter((event) => event.type === 'store-error')).toEqual([expect.objectContaining({ phase: 'get' })]);
    await engine.begin(request);
    expect(reads).toBe(2);
  });

  it('holds: every response the engine would store reads back as replayable', () => {
    const record = completed({ status: 201, headers: { 'content-type': 'application/json', etag: '"é\t"' }, body });
    expect(unreadableRecord(record as StoreRecord)).toBeUndefined();
    expect(unreadableRecord({ state: 'abandoned', token: 't', fingerprint: 'f' })).toBeUndefined();
  });
});
