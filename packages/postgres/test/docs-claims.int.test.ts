// Documentation claims about @idem/postgres checked against the real PostgreSQL (docs audit of 2026-12).
import { randomUUID } from 'node:crypto';
import { createIdempotency } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type PostgresStore, postgresStore } from '../src/index.js';
import { freshTable, postgresAvailable, sql, testPool } from './database.js';

const available = await postgresAvailable();
const hour = 60 * 60 * 1000;

describe.runIf(available)('@idem/postgres: documentation claims', () => {
  const pool = testPool({ max: 2 });
  let table: string;
  let drop: () => Promise<void>;
  let store: PostgresStore;

  beforeAll(async () => {
    ({ table, drop } = await freshTable(pool, 'docs_claims'));
    store = postgresStore({ client: pool, table });
  });
  afterAll(async () => {
    await drop?.();
    await pool.end();
  });

  const rows = async () => sql(pool, `SELECT id, state, lease_until, expires_at FROM "${table}"`);
  // A crash `ms` ago: the lease ended then, and the keep the claim asked for (the engine's retention)
  // runs from there, as the store would have written it had nobody renewed the lease.
  const crashedAgo = (id: string, ms: number, keepMs: number) =>
    sql(
      pool,
      `UPDATE "${table}" SET lease_until = clock_timestamp() - $2::float8 * interval '1 millisecond',
         expires_at = clock_timestamp() + ($3::float8 - $2::float8) * interval '1 millisecond' WHERE id = $1`,
      [id, ms, keepMs],
    );

  // docs/stores.md, "Purging": "A record still in progress is purged only `inProgressGraceMs` (default
  // one hour) after it expired: after its lease and the keep that follows it", the operations table,
  // operations.md, packages/postgres/README.md and PurgeOptions' JSDoc. For a claim made by the engine
  // the keep is the retention: a crash two hours ago leaves a row that still refuses other parameters.
  it('keeps an engine claim whose lease ended two hours ago, and purges it a grace after its keep', async () => {
    const engine = createIdempotency({ store, heartbeat: false });
    const started = await engine.begin({
      key: randomUUID(),
      scope: 'user:alice',
      operation: 'POST /charges',
      fingerprint: 'abc',
    });
    expect(started.kind).toBe('execute');
    const [row] = await rows();
    expect(row?.state).toBe('in_progress');
    const keep = engine.settings.retentionMs;
    await crashedAgo(row?.id, 2 * hour, keep);
    expect(await store.purgeExpired()).toBe(0);
    // The keep ended half a grace ago: still there; a grace and a minute ago: gone.
    await crashedAgo(row?.id, keep + hour / 2, keep);
    expect(await store.purgeExpired()).toBe(0);
    await crashedAgo(row?.id, keep + hour + 60_000, keep);
    expect(await store.purgeExpired()).toBe(1);
    expect(await rows()).toEqual([]);
  });
});
