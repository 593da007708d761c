// The PostgreSQL of the transactional timeout tests (Express's listener review, Koa's timeout audit):
// a records table and an effects table of their own, for a describe block.
import { randomBytes } from 'node:crypto';
import { migrate, postgresStore } from '@idem/postgres';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import pg from 'pg';
import { afterAll, beforeAll } from 'vitest';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** Whether the PostgreSQL at DATABASE_URL answers; says so loudly (and fails under CI) when not. */
export async function postgresForTimeouts(what: string): Promise<boolean> {
  return serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), what);
}

/**
 * A records table `idem_<name>_<random>` and an effects table (key, step) of the calling describe
 * block's own, made before its tests and dropped after them.
 *
 * @example
 * const db = transactionalTables('koa_timeout_tx');
 * app.use(idempotency({ store: db.store(), transactional: true }));
 * // a handler: tx.query(`INSERT INTO "${db.effects}" (key, step) VALUES ($1, 'debit')`, [key])
 * expect(await db.steps(key)).toEqual(['credit', 'debit']);
 */
export function transactionalTables(name: string) {
  const run = randomBytes(4).toString('hex');
  const table = `idem_${name}_${run}`;
  const effects = `idem_${name}_effects_${run}`;
  let pool: pg.Pool | undefined;
  const opened = (): pg.Pool => {
    if (!pool) throw new Error('transactionalTables: used outside its describe block');
    return pool;
  };
  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
    pool.on('error', () => undefined);
    await migrate(pool, { table });
    await pool.query(`CREATE TABLE "${effects}" (key text, step text)`);
  });
  afterAll(async () => {
    await opened().query(`DROP TABLE IF EXISTS "${table}"`);
    await opened().query(`DROP TABLE IF EXISTS "${effects}"`);
    await opened().end();
  });
  return {
    /** This block's random part of the names, for keys of its own. */
    run,
    /** The effects table's name. */
    effects,
    /** A store on the records table. */
    store: () => postgresStore({ client: opened(), table }),
    /** The steps the handler committed for `key`, in order of their names. */
    steps: async (key: string): Promise<string[]> =>
      (await opened().query(`SELECT step FROM "${effects}" WHERE key = $1 ORDER BY step`, [key])).rows.map(
        (row: { step: string }) => row.step,
      ),
  };
}
