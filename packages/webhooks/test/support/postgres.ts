// Where the real PostgreSQL of the webhook integration tests is, and whether it answers: skipped
// loudly when it does not, and a failure under CI=true.
import { randomBytes } from 'node:crypto';
import pg from 'pg';

export const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

export async function postgresAvailable(what: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: 2000 });
  client.on('error', () => undefined);
  let available = false;
  try {
    await client.connect();
    await client.query('SELECT 1');
    available = true;
  } catch {
    available = false;
  } finally {
    await client.end().catch(() => undefined);
  }
  if (available) return true;
  const message = `PostgreSQL at ${databaseUrl} is not reachable: the @idem/webhooks ${what} tests are SKIPPED.`;
  if (process.env.CI === 'true') throw new Error(`CI=true and ${message}`);
  console.warn(`\n!!! ${message}\n`);
  return false;
}

/** A table name no other test file or run uses. */
export const uniqueTable = (label: string) => `idem_wh_${label}_${randomBytes(4).toString('hex')}`;

export function testPool(options: pg.PoolConfig = {}): pg.Pool {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 10, ...options });
  pool.on('error', () => undefined);
  return pool;
}
