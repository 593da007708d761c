// Two processes of the reference app starting at once on one empty PostgreSQL database (a deploy of
// two replicas, or a restart that overlaps the old process): each runs the start-up schema and seed.
// `migrateApi` says "Safe to run on every start", and the packages' own migrations (@idem/postgres
// migrate(), the webhooks outbox) take an advisory lock for exactly this case.
import { randomBytes } from 'node:crypto';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import pg from 'pg';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { type Database, openDatabase } from '../src/db.js';
import { migrateIdp } from '../src/idp/schema.js';
import { migrateApi } from '../src/schema/api-schema.js';
import { seed } from '../src/seed.js';

const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
// Asked first: without PostgreSQL these tests are skipped with a warning (failed under CI=true), as
// the README promises, not failed on ECONNREFUSED in a hook.
const available = serviceAvailable(`PostgreSQL at ${url}`, await postgresAnswers(url), 'the start-up race tests');

const opened: Array<{ db: Database; schema: string }> = [];
const schemaOf = (db: Database) => opened.find((entry) => entry.db === db)?.schema as string;
afterEach(async () => {
  const dropped = new Set<string>();
  for (const { db, schema } of opened.splice(0)) {
    if (!dropped.has(schema)) {
      dropped.add(schema);
      await db.query(`drop schema if exists ${schema} cascade`).catch(() => undefined);
    }
    await db.close();
  }
});

/** Two independent pools (two processes) on one fresh, empty schema. */
async function twoProcesses(): Promise<[Database, Database]> {
  const schema = `audit_lifecycle_${randomBytes(5).toString('hex')}`;
  const a = await openDatabase({ url, schema });
  opened.push({ db: a, schema });
  const b = await openDatabase({ url, schema });
  opened.push({ db: b, schema });
  return [a, b];
}

describe.runIf(available)('two reference-app processes starting at once on an empty PostgreSQL database', () => {
  // Was a defect: migrateApi (and migrateIdp, migrateApp) run bare CREATE TABLE IF NOT EXISTS with no lock, so the second process fails its start with 23505 on pg_type_typname_nsp_index.
  it('both create the API and identity-provider schema without failing', async () => {
    const [a, b] = await twoProcesses();
    const results = await Promise.allSettled([migrateApi(a), migrateApi(b), migrateIdp(a), migrateIdp(b)]);
    const failures = results.flatMap((result) =>
      result.status === 'rejected' ? [`${result.reason?.code} ${result.reason?.message}`] : [],
    );
    expect(failures).toEqual([]);
  });

  // Was a defect: seed() reads the app client, makes a secret when there is none and upserts the client, so two first starts each keep their own secret and the last upsert wins: the other process's third-party app then authenticates with a secret the provider no longer has (invalid_client on every sign-in).
  it('both seed the same secret for the third-party app client', async () => {
    const [a, b] = await twoProcesses();
    // The schema exists first, so only the seed races.
    await migrateIdp(a);
    // Pins the interleaving that two real starts hit now and then: both read the (absent) client
    // before either writes it. A SHARE lock lets every read through and holds every write.
    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    let seeded: Awaited<ReturnType<typeof seed>>[];
    try {
      await holder.query('begin');
      await holder.query(`lock table ${schemaOf(a)}.idp_models in share mode`);
      const appRedirectUri = 'http://localhost:8083/callback';
      const seeding = Promise.all([seed(a, { appRedirectUri }), seed(b, { appRedirectUri })]);
      await vi.waitFor(
        async () => {
          const waiting = await holder.query(
            'select count(*)::int as n from pg_locks where relation = $1::regclass and not granted',
            [`${schemaOf(a)}.idp_models`],
          );
          expect(waiting.rows[0].n).toBe(2);
        },
        { timeout: 10_000, interval: 20 },
      );
      await holder.query('commit');
      seeded = await seeding;
    } finally {
      await holder.end();
    }
    const [first, second] = seeded as [Awaited<ReturnType<typeof seed>>, Awaited<ReturnType<typeof seed>>];
    const { rows } = await a.query<{ payload: { client_secret: string } }>(
      "select payload from idp_models where model = 'Client' and id = $1",
      [first.app.clientId],
    );
    const stored = rows[0]?.payload.client_secret;
    expect({ first: first.app.clientSecret === stored, second: second.app.clientSecret === stored }).toEqual({
      first: true,
      second: true,
    });
  });
});
