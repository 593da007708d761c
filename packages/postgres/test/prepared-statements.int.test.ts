// Named prepared statements behind a pooler in transaction mode (PgBouncer before 1.21, or with
// max_prepared_statements = 0): pg prepares a statement once per connection, but the pooler hands
// the next transaction another server session, which lacks it (26000) or has it already (42P05).
// Here the same happens on one connection: DEALLOCATE ALL takes the server's statements away while
// pg still believes them prepared.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresStore } from '../src/index.js';
import { freshTable, postgresAvailable, testPool } from './database.js';

const available = await postgresAvailable();

describe.runIf(available)('a prepared statement the server session no longer has', () => {
  const pool = testPool({ max: 1 });
  let table: string;
  let drop: () => Promise<void>;

  beforeAll(async () => {
    ({ table, drop } = await freshTable(pool, 'prepared'));
  });

  afterAll(async () => {
    await drop();
    await pool.end();
  });

  const claim = (store: ReturnType<typeof postgresStore>) =>
    store.claim({ id: randomUUID(), token: randomUUID(), fingerprint: 'fp', leaseMs: 5_000 });

  // Was a defect (found by an audit of PostgreSQL behind PgBouncer): the claim failed with pg's bare
  // `prepared statement "idem_..." does not exist`, a 503 whose store-error event did not say that
  // the fix is `preparedStatements: false`.
  it('fails with an error that names preparedStatements: false', async () => {
    const store = postgresStore({ client: pool, table });
    await claim(store);
    await pool.query('DEALLOCATE ALL');
    const failure = await claim(store).catch((error: unknown) => error as Error & { code?: string });
    expect(failure).toBeInstanceOf(Error);
    expect((failure as Error).message).toMatch(/preparedStatements: false/);
    expect((failure as { code?: string }).code).toBe('26000');
  });

  it('does not happen with preparedStatements: false', async () => {
    const store = postgresStore({ client: pool, table, preparedStatements: false });
    await claim(store);
    await pool.query('DEALLOCATE ALL');
    await expect(claim(store)).resolves.toEqual({ claimed: true });
  });
});
