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
import { createUser, findUserByUsername } from '../src/idp/users.js';
import { migrateApi } from '../src/schema/api-schema.js';
import { demoUsers, seed } from '../src/seed.js';

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

/**
 * Waits until `count` sessions wait on a lock the holder has (theirs alone: other test files share
 * the server), failing at once with what `failure()` returns once it returns something.
 */
async function untilBlocked(holder: pg.Client, count: number, failure: () => unknown = () => undefined) {
  await vi.waitFor(
    async () => {
      const failed = failure();
      if (failed) throw failed;
      const { rows } = await holder.query(
        'select count(*)::int as n from pg_stat_activity where pg_backend_pid() = any(pg_blocking_pids(pid))',
      );
      expect(rows[0].n).toBe(count);
    },
    { timeout: 10_000, interval: 20 },
  );
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

  // Was a defect: createUser inserted with `on conflict (username) do nothing`, but a demo account
  // has a fixed id too, and two inserts in flight at once meet first on the primary key, which that
  // clause does not cover: the second start failed with 23505 idp_users_pkey (seen in CI, seeding).
  it('both create the same demo account without failing', async () => {
    const [a, b] = await twoProcesses();
    await migrateIdp(a);
    const alice = { ...demoUsers[0], roles: [...demoUsers[0].roles] };
    // Pins the interleaving: a third session holds an uncommitted row with the account's id (under
    // another name), so both inserts get past the username check and wait on the primary key; when
    // it rolls back, one insert goes in and the other meets it there.
    const holder = new pg.Client({ connectionString: url });
    await holder.connect();
    let created: PromiseSettledResult<unknown>[];
    try {
      await holder.query('begin');
      await holder.query(
        `insert into ${schemaOf(a)}.idp_users (id, username, password_hash, name, email) values ($1, 'placeholder', 'x', 'x', 'x')`,
        [alice.id],
      );
      const creating = Promise.allSettled([createUser(a, alice), createUser(b, alice)]);
      await untilBlocked(holder, 2);
      await holder.query('rollback');
      created = await creating;
    } finally {
      await holder.end();
    }
    const failures = created.flatMap((result) =>
      result.status === 'rejected' ? [`${result.reason?.code} ${result.reason?.message}`] : [],
    );
    expect(failures).toEqual([]);
    expect((await findUserByUsername(a, alice.username))?.id).toBe(alice.id);
  });

  it('refuses an account whose id another user has, naming both (no bare 23505)', async () => {
    const [a] = await twoProcesses();
    await migrateIdp(a);
    const account = { id: 'user-shared', password: 'pw', name: 'N', email: 'n@example.com' };
    await createUser(a, { ...account, username: 'first' });
    await expect(createUser(a, { ...account, username: 'second' })).rejects.toThrow(
      'createUser: the id user-shared belongs to another user than second',
    );
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
      // A seed that fails before it reaches the lock is this test's failure, reported as itself
      // (it was an unhandled rejection and a lock count that never came).
      let failed: unknown;
      seeding.catch((error: unknown) => {
        failed = error;
      });
      await untilBlocked(holder, 2, () => failed);
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
