// A PostgreSQL store on a table of its own for one audit file: the table is migrated before the
// file's tests and dropped after them; without PostgreSQL the file says so and its suites skip.
import { randomBytes } from 'node:crypto';
import { migrate, type PostgresStore, postgresStore } from '@idem/postgres';
import { databaseUrl, postgresAnswers, serviceAvailable } from '@idem/testkit';
import pg from 'pg';
import { afterAll, beforeAll } from 'vitest';

/**
 * Registers the file's setup and teardown and answers whether PostgreSQL is there, and a store on
 * the file's table (call it inside a test: the pool exists from `beforeAll` on).
 */
export async function postgresStoreTable(
  prefix: string,
  audit: string,
): Promise<{ available: boolean; store: () => PostgresStore }> {
  const url = databaseUrl();
  const available = serviceAvailable(`PostgreSQL at ${url}`, await postgresAnswers(url), audit);
  const table = `${prefix}_${randomBytes(4).toString('hex')}`;
  let pool: pg.Pool | undefined;
  beforeAll(async () => {
    if (!available) return;
    pool = new pg.Pool({ connectionString: url, max: 6 });
    pool.on('error', () => undefined);
    await migrate(pool, { table });
  });
  afterAll(async () => {
    if (pool === undefined) return;
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });
  return { available, store: () => postgresStore({ client: pool as pg.Pool, table }) };
}
