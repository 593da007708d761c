// A pg Pool pushed past its capacity (more requests than connections, for seconds): what the engine
// does with store calls that wait in the pool's queue. Measured on the 2-core box with Express, a
// Pool of 2 and 1,500 new keys a second for 20 s (the audit's load runs): both cases below showed up
// by the thousand, not as rare races.
import { randomUUID } from 'node:crypto';
import { createIdempotency, type IdempotencyEvent, recordId } from '@idem/core';
import type pg from 'pg';
import { describe, expect, it } from 'vitest';
import { postgresStore } from '../src/index.js';
import { postgresAvailable } from './database.js';
import { idle, poolsOnFreshTable } from './pools.js';

const available = await postgresAvailable();
const response = { status: 201, headers: {}, body: new TextEncoder().encode('{"id":"ch_1"}') };
const request = () => ({ key: randomUUID(), scope: 'caller', operation: 'POST /charges', fingerprint: 'f' });

// Takes the pool's only connection, as the other requests of an overloaded server hold them all.
async function holdTheOnlyConnection(pool: pg.Pool): Promise<() => void> {
  const client = await pool.connect();
  return () => client.release();
}

describe.runIf(available)('a saturated pg Pool', () => {
  const fixture = poolsOnFreshTable('saturated');
  const { admin, poolOf } = fixture;

  // Was wrong: with the Pool the docs recommend (connectionTimeoutMillis: 1_000), a completion that
  // waits too long for a connection is dropped from the pool's queue (the outcome is never written),
  // and the engine then released the key in the background; that release found a connection a
  // moment later and deleted the record. The handler ran and its client got its 201, but the outcome
  // was gone: a retry (a client that timed out, as clients of an overloaded server do) ran the
  // handler again (2,322 of 30,606 keys in the audit's load run). The engine now asks the store
  // again, the key held meanwhile.
  it('keeps the outcome of a handler whose completion found no connection in time', async () => {
    const pool = poolOf({ connectionTimeoutMillis: 200 });
    const events: IdempotencyEvent[] = [];
    const store = postgresStore({ client: pool, table: fixture.table });
    const engine = createIdempotency({ store, storeTimeout: '2s', onEvent: (event) => events.push(event) });
    // The pool's connection opened and the store's look at its table done first: on a busy box a
    // fresh connection can take longer than the 200 ms allowed, and the claim below must get through.
    await store.get(recordId('warm-up', 'POST /charges', randomUUID()));
    const first = request();
    const started = await engine.begin(first);
    if (started.kind !== 'execute') throw new Error('a fresh key executes');
    // The handler's effect happens here. Then every connection is busy when it completes.
    const free = await holdTheOnlyConnection(pool);
    const completed = await engine.complete(started.lease, response);
    expect(completed).toMatchObject({ ok: false, reason: 'store-error' });
    // The load moves on: a connection comes free, and the engine's background release takes it.
    free();
    await expect.poll(() => idle(pool)).toBe(true);

    // The handler must not run a second time for one request: held (409) until the completion is
    // stored, then replayed.
    await expect
      .poll(async () => {
        const retry = await engine.begin(first);
        expect(retry.kind).not.toBe('execute');
        return retry.kind;
      })
      .toBe('replay');
    expect(events.filter((event) => event.type !== 'conflict').map((event) => event.type)).toEqual([
      'claim',
      'store-error',
      'complete',
      'replay',
    ]);
  });

  // Was wrong: storeTimeout answers the request (503, "nothing was executed, retry"), but the claim
  // stays in the pool's queue and runs whenever a connection comes free, for nobody. Its record then
  // held the key for a whole lease: the client's retry after Retry-After (2 s) got 409 until the
  // lease ended (10 s by default), and was then run as a "recovered" takeover of a crashed attempt,
  // though nothing ever ran. The engine now withdraws such a claim as soon as it lands. (The pool's
  // queue still grows under sustained overload with pg's defaults: `connectionTimeoutMillis`, which
  // docs/stores.md recommends, bounds it; the Store contract cannot withdraw a queued call.)
  it('a claim answered 503 for a full pool does not take the key later', async () => {
    // pg's default: a connect waits in the queue for as long as it takes.
    const pool = poolOf({});
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: postgresStore({ client: pool, table: fixture.table }),
      storeTimeout: '200ms',
      onEvent: (event) => events.push(event),
    });
    const first = request();
    const free = await holdTheOnlyConnection(pool);
    const refused = await engine.begin(first);
    expect(refused).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable' } });
    free();
    const store = postgresStore({ client: admin, table: fixture.table });
    const id = recordId(first.scope, first.operation, first.key);
    await expect.poll(async () => idle(pool) && (await store.get(id)) === undefined).toBe(true);
    // The late claim did land (and was withdrawn): a store-error for the 503, nothing else.
    expect(events.map((event) => event.type)).toEqual(['store-error']);

    // The client retries as told; nothing ran, so its request runs now.
    const retry = await engine.begin(first);
    expect(retry.kind).toBe('execute');
  });
});
