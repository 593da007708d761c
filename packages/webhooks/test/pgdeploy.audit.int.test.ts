// The outbox as a DBA deploys it: the table made once by an owner (or a migration tool), and the
// application connecting as a role that may only read and write it (SELECT, INSERT, UPDATE, DELETE,
// no CREATE on the schema). @idem/postgres supports exactly that for its own migrate() ("once the
// table and its index exist, a role that may only read and write the table can run it too"), and
// docs/webhooks.md calls the outbox's migrate() safe "on every boot", as its example does at startup.
import { randomBytes } from 'node:crypto';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox } from '../src/index.js';
import { postgresAvailable, testPool } from './support/postgres.js';

const available = await postgresAvailable('least-privilege outbox');

describe.runIf(available)('outbox migrate() under a role that may only read and write its table', () => {
  const suffix = randomBytes(4).toString('hex');
  const schema = `idem_pgdeploy_${suffix}`;
  const role = `idem_pgdeploy_rw_${suffix}`;
  const table = `${schema}.webhook_outbox`;
  const outbox = createOutbox({ table });
  const pool = testPool({ max: 2 });
  let app: pg.PoolClient;

  beforeAll(async () => {
    await pool.query(`CREATE SCHEMA "${schema}"`);
    await pool.query(`CREATE ROLE "${role}" NOLOGIN`);
    // The owner's deploy: table, columns and index all made.
    await outbox.migrate(pool);
    await pool.query(`GRANT USAGE ON SCHEMA "${schema}" TO "${role}"`);
    await pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "${schema}" TO "${role}"`);
    // The application's session: the least-privilege role.
    app = await pool.connect();
    await app.query(`SET ROLE "${role}"`);
  });

  afterAll(async () => {
    app?.release(true);
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await pool.query(`DROP ROLE IF EXISTS "${role}"`);
    await pool.end();
  });

  it('the role can use the outbox: add() and the relay claim work', async () => {
    await app.query('BEGIN');
    const added = await outbox.add(app, { url: 'https://partner.example/hooks', body: { ok: true } });
    await app.query('COMMIT');
    expect(added.added).toBe(true);
  });

  // Was a defect: createOutbox().migrate() (packages/webhooks/src/outbox-schema.ts, `migrate`) always runs
  // `CREATE TABLE IF NOT EXISTS`, and PostgreSQL checks CREATE on the schema before it looks whether
  // the table exists: with the table, its columns and its index all there, a role that may only read
  // and write the table gets `permission denied for schema` (42501), so an app that calls migrate()
  // on every boot, as the docs show, cannot start under least privilege. @idem/postgres's migrate()
  // looks first (to_regclass) and runs only the DDL that is missing; the outbox should do the same.
  it('migrate() succeeds when there is nothing to create', async () => {
    await expect(outbox.migrate(app)).resolves.toBeUndefined();
  });

  it('the role can purge (DELETE is all it needs)', async () => {
    await expect(outbox.purge(app, { olderThan: '30d', dead: true })).resolves.toEqual({ deleted: 0 });
  });
});
