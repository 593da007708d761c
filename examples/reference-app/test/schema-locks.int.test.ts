// Start-up schema scripts on a database already up to date, while transactions are open on every
// table (a charge, a login, a note): they must not wait for those transactions. `create index if not
// exists` and `alter table ... add column if not exists` take their table's lock before they look, so
// a restart (or a second instance starting) stalled behind the longest open transaction, and every
// statement on those tables queued behind the waiting DDL. Real PostgreSQL (DATABASE_URL).
import { randomBytes } from 'node:crypto';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateApp } from '../src/app/schema.js';
import { type Database, openDatabase } from '../src/db.js';
import { migrateIdp } from '../src/idp/schema.js';
import { migrateApi } from '../src/schema/api-schema.js';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
// Asked first: without PostgreSQL these tests are skipped with a warning (failed under CI=true), as
// the README promises, not failed on ECONNREFUSED in a hook.
const available = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the schema-lock tests',
);
const schema = `schema_locks_${randomBytes(5).toString('hex')}`;
const migrateAll = async (db: Database) => {
  await migrateIdp(db);
  await migrateApp(db);
  await migrateApi(db);
};

describe.runIf(available)('start-up schema scripts on an up-to-date database', () => {
  let db: Database;
  const holder = new pg.Client({ connectionString: databaseUrl, options: `-c search_path=${schema},public` });

  beforeAll(async () => {
    db = await openDatabase({ url: databaseUrl, schema });
    await migrateAll(db);
    await holder.connect();
  });

  afterAll(async () => {
    await holder.query('rollback').catch(() => undefined);
    await holder.end().catch(() => undefined);
    await db?.query(`drop schema if exists ${schema} cascade`);
    await db?.close();
  });

  it('take no lock that waits for the transactions open on their tables', async () => {
    // What a write in a running request holds on each table an index or column is ensured on.
    await holder.query('begin');
    for (const table of ['idp_models', 'app_sessions', 'api_photos', 'receiver_event_notes']) {
      await holder.query(`lock table ${table} in row exclusive mode`);
    }
    const again = migrateAll(db).then(() => 'done' as const);
    const outcome = await Promise.race([
      again,
      new Promise<'stalled'>((resolve) => setTimeout(() => resolve('stalled'), 5_000)),
    ]);
    await holder.query('rollback');
    await again;
    expect(outcome).toBe('done');
  });

  it('still add what is missing: the column and index a table made before them lacks', async () => {
    await db.query('drop index receiver_event_notes_request_key');
    await db.query('alter table receiver_event_notes drop column request_key');
    // The session lifetime's column, on a table made before it: its rows count as created now.
    await db.query('alter table app_sessions drop column created_at');
    await migrateAll(db);
    const sessions = await db.query<{ name: string }>(
      `select attname as name from pg_attribute where attrelid = to_regclass('app_sessions') and attname = 'created_at' and not attisdropped`,
    );
    expect(sessions.rows).toEqual([{ name: 'created_at' }]);
    const { rows } = await db.query<{ name: string }>(
      `select attname as name from pg_attribute where attrelid = to_regclass('receiver_event_notes') and attname = 'request_key' and not attisdropped
       union all select relname from pg_class where oid = to_regclass('receiver_event_notes_request_key')`,
    );
    expect(rows.map((row) => row.name).sort()).toEqual(['receiver_event_notes_request_key', 'request_key']);
  });
});
