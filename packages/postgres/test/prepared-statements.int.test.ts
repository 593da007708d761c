// Named prepared statements behind a pooler in transaction mode (PgBouncer before 1.21, or with
// max_prepared_statements = 0): pg prepares a statement once per connection, but the pooler hands
// the next transaction another server session, which lacks it (26000) or has it already (42P05).
// Here the same happens on one connection: DEALLOCATE ALL takes the server's statements away while
// pg still believes them prepared. (pgbouncer.audit.int.test.ts runs a real PgBouncer.)
import { createHash, randomUUID } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresStore } from '../src/index.js';
import { databaseUrl, freshTable, postgresAvailable, testPool } from './database.js';

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

  const preparedOnServer = async (client: { query(text: string): Promise<{ rows: { n: number }[] }> }) =>
    (await client.query(`SELECT count(*)::int AS n FROM pg_prepared_statements WHERE name LIKE 'idem\\_%'`)).rows[0]?.n;

  // Was a defect twice over (found by audits of PostgreSQL behind PgBouncer): the claim failed with
  // pg's bare `prepared statement "idem_..." does not exist`; then with an error naming
  // `preparedStatements: false`, but still a 503, about every other request behind such a pooler.
  // The statement failed at Bind, before it ran: it is sent again unnamed, and so is every later one.
  it('is sent again unnamed, and the store prepares nothing after that (pg Pool)', async () => {
    const store = postgresStore({ client: pool, table });
    await claim(store);
    expect(await preparedOnServer(pool)).toBeGreaterThan(0);
    await pool.query('DEALLOCATE ALL');
    await expect(claim(store)).resolves.toEqual({ claimed: true });
    await expect(store.get(randomUUID())).resolves.toBeUndefined();
    expect(await preparedOnServer(pool)).toBe(0);
  });

  it('is sent again unnamed on a single pg Client too', async () => {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    try {
      const store = postgresStore({ client, table });
      await claim(store);
      await client.query('DEALLOCATE ALL');
      await expect(claim(store)).resolves.toEqual({ claimed: true });
      expect(await preparedOnServer(client)).toBe(0);
    } finally {
      await client.end();
    }
  });

  it('a name the server session already has (42P05) is sent unnamed as well', async () => {
    const first = new pg.Client({ connectionString: databaseUrl });
    const second = new pg.Client({ connectionString: databaseUrl });
    await first.connect();
    await second.connect();
    try {
      await claim(postgresStore({ client: first, table }));
      const claimName = (
        await first.query(`SELECT name FROM pg_prepared_statements WHERE name LIKE 'idem\\_claim%'`)
      ).rows.map((row) => row.name as string)[0];
      if (claimName === undefined) throw new Error('the claim was prepared');
      // Another client of the pooler prepared it on the server session this one now runs on.
      await second.query(`PREPARE ${claimName} AS SELECT 1`);
      await expect(claim(postgresStore({ client: second, table }))).resolves.toEqual({ claimed: true });
    } finally {
      await first.end();
      await second.end();
    }
  });

  it('does not happen with preparedStatements: false', async () => {
    const store = postgresStore({ client: pool, table, preparedStatements: false });
    await claim(store);
    await pool.query('DEALLOCATE ALL');
    await expect(claim(store)).resolves.toEqual({ claimed: true });
  });
});

// Behind a pooler in transaction mode, server sessions are shared by every client of the pooler,
// the instances of a rolling deploy included. A pg connection that prepared a statement on one
// session Binds it by name on the next, without parsing again. Statement names were the table's
// hash only, the same in every version: an older version's claim, prepared under that name on the
// session this connection now runs on, ran in place of this version's, with its parameters. Here an
// older claim of the same name and parameters that only answers "claimed" (and writes nothing).
describe.runIf(available)('a statement of another version under the same name on a shared session', () => {
  const pool = testPool({ max: 1 });
  let table: string;
  let drop: () => Promise<void>;

  beforeAll(async () => {
    ({ table, drop } = await freshTable(pool, 'prepared_versions'));
  });

  afterAll(async () => {
    await drop();
    await pool.end();
  });

  it("is never run in place of this version's statement", async () => {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    try {
      const store = postgresStore({ client, table });
      await store.claim({ id: randomUUID(), token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      // The name every version before this one gave its claim on this table.
      const oldName = `idem_claim_${createHash('sha256').update(table).digest('hex').slice(0, 12)}`;
      const existing = await client.query('SELECT 1 FROM pg_prepared_statements WHERE name = $1', [oldName]);
      if (existing.rowCount) await client.query(`DEALLOCATE ${oldName}`);
      await client.query(`PREPARE ${oldName} (text, text, text, float8, float8, text) AS
        SELECT true AS claimed, NULL::text AS state, NULL::text AS token, NULL::text AS fingerprint,
               NULL::integer AS status, NULL::jsonb AS headers, NULL::bytea AS body, NULL::boolean AS abandoned
        WHERE $1 IS NOT NULL OR $2 IS NOT NULL OR $3 IS NOT NULL OR $4 IS NOT NULL OR $5 IS NOT NULL OR $6 IS NULL`);
      const id = randomUUID();
      await expect(store.claim({ id, token: 't2', fingerprint: 'fp', leaseMs: 5_000 })).resolves.toEqual({
        claimed: true,
      });
      expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't2', fingerprint: 'fp' });
    } finally {
      await client.end();
    }
  });
});
