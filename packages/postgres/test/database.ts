// Shared by the @idem/postgres tests: where the real PostgreSQL is, whether it answers (loudly
// skipping, or failing under CI=true, when it does not), unique table names, and the harness that
// lets describeStore() expire a record through SQL instead of sleeping.
import { randomBytes } from 'node:crypto';
import { postgresAnswers, type StoreHarness, serviceAvailable } from '@idem/testkit';
import pg from 'pg';
import { migrate, type PostgresClient, type PostgresStore, postgresStore, type SqlExecutor } from '../src/index.js';

/** The shared PostgreSQL of the integration tests. */
export const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** True when PostgreSQL at DATABASE_URL answers; says so loudly when not, throws when CI=true. */
export async function postgresAvailable(): Promise<boolean> {
  return serviceAvailable(
    `PostgreSQL at ${databaseUrl}`,
    await postgresAnswers(databaseUrl),
    'these @idem/postgres integration tests',
  );
}

/** A table name no other test file (or run) uses. */
export const uniqueTable = (label: string) => `idem_test_${label}_${randomBytes(4).toString('hex')}`;

/** A pg Pool on DATABASE_URL with the 'error' listener every pool owner must attach. */
export function testPool(options: pg.PoolConfig = {}): pg.Pool {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 10, ...options });
  pool.on('error', () => undefined);
  return pool;
}

/** Runs SQL on any client the store accepts, outside the store (for setup and inspection). */
export async function sql(client: PostgresClient, text: string, params: unknown[] = []): Promise<any[]> {
  const result = await (client as unknown as SqlExecutor).query(text, params);
  return (result as { rows: any[] }).rows;
}

/**
 * The describeStore() harness for a PostgreSQL store: expiry moves `expires_at` into the past by
 * SQL, with the database clock, which is exactly what time passing would do.
 */
export function harness(client: PostgresClient, store: PostgresStore, close?: () => Promise<void>): StoreHarness {
  const table = store.table
    .split('.')
    .map((part) => `"${part}"`)
    .join('.');
  const built: StoreHarness = {
    store,
    expire: async (id) => {
      await sql(client, `UPDATE ${table} SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE id = $1`, [
        id,
      ]);
    },
    // A crashed holder's lease, run out now by the database clock: the record goes as long after it
    // as the claim's keep says (at once for a claim without one).
    endLease: async (id) => {
      await sql(
        client,
        `UPDATE ${table} SET
           lease_until = CASE WHEN lease_until IS NOT NULL THEN clock_timestamp() - interval '1 millisecond' END,
           expires_at = clock_timestamp() - interval '1 millisecond' + (expires_at - COALESCE(lease_until, expires_at))
         WHERE id = $1`,
        [id],
      );
    },
    ttl: async (id) => {
      const rows = await sql(
        client,
        `SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8 AS ms FROM ${table} WHERE id = $1`,
        [id],
      );
      return rows[0] === undefined ? undefined : Number(rows[0].ms);
    },
    makeCapped: (maxBytes) => postgresStore({ client, table: store.table, maxResponseBytes: maxBytes }),
    // A store made afresh over the same table, as a restarted process makes it.
    reopen: () => postgresStore({ client, table: store.table }),
  };
  if (close) built.close = close;
  return built;
}

/** Creates a fresh table for one test file and returns it with a function that drops it. */
export async function freshTable(
  client: PostgresClient,
  label: string,
): Promise<{ table: string; drop: () => Promise<void> }> {
  const table = uniqueTable(label);
  await migrate(client, { table });
  return { table, drop: async () => void (await sql(client, `DROP TABLE IF EXISTS "${table}"`)) };
}
