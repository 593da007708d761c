// storeUnavailable: 'fail-open' (anchors case 14) on a real PostgreSQL: what counts as a store that
// cannot be reached, and what a claim the engine gave up on does once it lands.
import { randomUUID } from 'node:crypto';
import { createIdempotency, type IdempotencyEvent, recordId } from '@idem/core';
import { describe, expect, it } from 'vitest';
import { postgresStore } from '../src/index.js';
import { postgresAvailable, uniqueTable } from './database.js';
import { idle, poolsOnFreshTable } from './pools.js';

const available = await postgresAvailable();
const request = () => ({ key: randomUUID(), scope: 'caller', operation: 'POST /charges', fingerprint: 'f' });

describe.runIf(available)("storeUnavailable: 'fail-open' on PostgreSQL", () => {
  const fixture = poolsOnFreshTable('failopen');
  const { admin, poolOf } = fixture;

  it('a claim that timed out runs the request unprotected, and is withdrawn when it lands late', async () => {
    const pool = poolOf({});
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: postgresStore({ client: pool, table: fixture.table }),
      storeTimeout: '200ms',
      onEvent: (event) => events.push(event),
    });
    const first = request();
    // The pool's only connection is busy: the claim waits in its queue past storeTimeout.
    const busy = await pool.connect();
    const started = await engine.begin({ ...first, storeUnavailable: 'fail-open' });
    expect(started).toEqual({ kind: 'unprotected' });
    busy.release();
    // The claim lands once the connection is free, for nobody: withdrawn, not left in progress.
    const store = postgresStore({ client: admin, table: fixture.table });
    const id = recordId(first.scope, first.operation, first.key);
    await expect.poll(async () => idle(pool) && (await store.get(id)) === undefined).toBe(true);
    expect(events).toMatchObject([{ type: 'store-error', phase: 'claim', unprotected: true }]);
    expect(events).toHaveLength(1);
    // The retry is a fresh run (the unprotected one left no record), not a 409 or a recovery.
    const retry = await engine.begin(first);
    expect(retry.kind).toBe('execute');
    expect(retry.kind === 'execute' && retry.lease.recovered).toBe(false);
  });

  // Was wrong: any error from the claim failed open, also one the database answered with, such as a
  // table that was never migrated (42P01) or a role without the grant (42501). The store was reached
  // and said no: every request then ran unprotected, for as long as the mistake lasted, where the
  // option promises that only for a store that cannot be reached (connection refused, storeTimeout).
  it('a claim the database refuses (a table never migrated) fails closed, not open', async () => {
    const pool = poolOf({});
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: postgresStore({ client: pool, table: uniqueTable('never_migrated') }),
      onEvent: (event) => events.push(event),
    });
    const started = await engine.begin({ ...request(), storeUnavailable: 'fail-open' });
    expect(started).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable' } });
    expect(events).toMatchObject([{ type: 'store-error', phase: 'claim' }]);
    expect(events.some((event) => 'unprotected' in event)).toBe(false);
  });
});
