// Where the real PostgreSQL of the webhook integration tests is, and whether it answers: skipped
// loudly when it does not, and a failure under CI=true.
import { randomBytes } from 'node:crypto';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import pg from 'pg';

export const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

export async function postgresAvailable(what: string): Promise<boolean> {
  return serviceAvailable(
    `PostgreSQL at ${databaseUrl}`,
    await postgresAnswers(databaseUrl),
    `the @idem/webhooks ${what} tests`,
  );
}

/** A table name no other test file or run uses. */
export const uniqueTable = (label: string) => `idem_wh_${label}_${randomBytes(4).toString('hex')}`;

export function testPool(options: pg.PoolConfig = {}): pg.Pool {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 10, ...options });
  pool.on('error', () => undefined);
  return pool;
}
