// Documentation claims about @idem/postgres checked against the real PostgreSQL (docs audit of 2026-12).
// An `it.fails` states what a page says where the code does otherwise: it passes while they differ.
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

  // docs/stores.md, "Purging expired records": "A record still in progress is purged only
  // `inProgressGraceMs` after its lease ended (default one hour)"; the same in the operations table
  // ("in progress: lease ended over `inProgressGraceMs` ago"), packages/postgres/README.md ("goes only
  // `inProgressGraceMs` ... after its lease ended") and PurgeOptions' JSDoc. The purge compares
  // `expires_at`, which for a claim made by the engine is the lease plus the keep after it (the
  // retention, 24 h): the crashed attempt's row stays abandoned, refusing other parameters, for that
  // long, and the grace counts from the end of the keep, not of the lease.
  it.fails('purges an engine claim whose lease ended two hours ago (grace one hour), as the docs say', async () => {
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
    await crashedAgo(row?.id, 2 * hour, engine.settings.retentionMs);
    await store.purgeExpired();
    expect(await rows()).toEqual([]);
  });
});
