// The store against the real PostgreSQL at DATABASE_URL, through a pg Pool and a single pg Client:
// the shared contract, the focused behaviours, and what only a real server with many connections
// can show (takeover racing a transaction, one Client shared by a transaction and other calls,
// refused connections).
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { recordId, StoreUnavailableError } from '@idem/core';
import { describeStore } from '@idem/testkit';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrate, type PgClientLike, type PostgresStore, postgresStore } from '../src/index.js';
import { buildStatements } from '../src/statements.js';
import { parseTableName } from '../src/table-name.js';
import { describePostgresBehaviour } from './behaviour.js';
import { databaseUrl, freshTable, harness, postgresAvailable, sql, testPool, uniqueTable } from './database.js';

const available = await postgresAvailable();

const freshId = () => recordId(`scope-${randomUUID()}`, 'POST /charges', randomUUID());
const body = (text: string) => ({ status: 200, headers: {}, body: new TextEncoder().encode(text) });

// The levels above READ COMMITTED, as `SHOW transaction_isolation` spells them.
const isolationLevels = [
  ['REPEATABLE READ', 'repeatable read'],
  ['SERIALIZABLE', 'serializable'],
] as const;
// A pool whose sessions default to `level`, as a role or database setting would make them.
const isolatedPool = (level: string, max: number) =>
  testPool({ max, options: `-c default_transaction_isolation=${level.replace(' ', '\\ ')}` });

describe.runIf(available)('PostgreSQL server', () => {
  describeStore('postgresStore on a pg Pool', async () => {
    const pool = testPool({ max: 20 });
    const { table, drop } = await freshTable(pool, 'pool_contract');
    const store = postgresStore({ client: pool, table });
    return harness(pool, store, async () => {
      await drop();
      await pool.end();
    });
  });

  describeStore('postgresStore on a single pg Client', async () => {
    const client = new pg.Client({ connectionString: databaseUrl });
    client.on('error', () => undefined);
    await client.connect();
    const { table, drop } = await freshTable(client, 'client_contract');
    const store = postgresStore({ client, table });
    return harness(client, store, async () => {
      await drop();
      await client.end();
    });
  });

  // A role or database with `default_transaction_isolation` raised: every statement of the store then
  // runs at that level. The whole contract again, its claim race included.
  for (const [label, level] of isolationLevels) {
    describeStore(`postgresStore on a pg Pool at ${label}`, async () => {
      const pool = isolatedPool(level, 20);
      const { table, drop } = await freshTable(pool, 'isolation_contract');
      const store = postgresStore({ client: pool, table });
      return harness(pool, store, async () => {
        await drop();
        await pool.end();
      });
    });
  }

  describe('default_transaction_isolation above READ COMMITTED', () => {
    let admin: pg.Pool;
    let table: string;
    let drop: () => Promise<void>;
    beforeAll(async () => {
      admin = testPool();
      ({ table, drop } = await freshTable(admin, 'isolation'));
    });
    afterAll(async () => {
      await drop();
      await admin.end();
    });
    const done = () => body('done');

    describe.each(isolationLevels)('%s', (_, level) => {
      let pool: pg.Pool;
      let store: PostgresStore;
      beforeAll(() => {
        pool = isolatedPool(level, 20);
        store = postgresStore({ client: pool, table });
      });
      afterAll(async () => {
        await pool.end();
      });

      it('runs at that level (the premise of the tests below)', async () => {
        const rows = await sql(pool, 'SHOW transaction_isolation');
        expect(rows[0].transaction_isolation).toBe(level);
      });

      it("answers the losers of a claim race with the winner's record, never an error", async () => {
        for (let round = 0; round < 5; round++) {
          const id = freshId();
          const results = await Promise.all(
            Array.from({ length: 20 }, (_, i) =>
              store.claim({ id, token: `t${i}`, fingerprint: 'fp', leaseMs: 5_000 }),
            ),
          );
          const winners = results.flatMap((result, i) => (result.claimed ? [`t${i}`] : []));
          expect(winners).toHaveLength(1);
          for (const result of results) {
            if (!result.claimed)
              expect(result.record).toEqual({ state: 'in_progress', token: winners[0], fingerprint: 'fp' });
          }
        }
      });

      it('completes and releases while heartbeats renew the same row, never an error', async () => {
        for (let round = 0; round < 20; round++) {
          const id = freshId();
          await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
          const renewals = Array.from({ length: 4 }, () => store.renew({ id, token: 't', leaseMs: 5_000 }));
          const finish =
            round % 2 === 0
              ? store.complete({ id, token: 't', response: done(), retentionMs: 60_000 })
              : store.release({ id, token: 't' });
          // Each renewal lands before the finish (true) or after it (false); none fails.
          for (const renewed of await Promise.all(renewals)) expect(typeof renewed).toBe('boolean');
          expect(await finish).toBe(true);
          expect((await store.get(id))?.state).toBe(round % 2 === 0 ? 'completed' : undefined);
        }
      });

      it('commits a transaction whose record nobody touched meanwhile', async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const result = await store.transaction({ id, token: 't' }, async (tx) => {
          await tx.query('SELECT 1');
          return { value: 'ok', response: done(), retentionMs: 60_000 };
        });
        expect(result).toEqual({ committed: true, value: 'ok' });
      });

      it("never runs a statement of the handler's transaction again: a renewal after its snapshot rolls it all back", async () => {
        // The completion at the end of the transaction meets the row renewed after the transaction's
        // snapshot: 40001. The transaction is aborted, so nothing of it may be retried by the store;
        // the call is a 503 and the handler's writes are gone. (docs/stores.md, Isolation levels.)
        const id = freshId();
        const marker = randomUUID();
        await sql(admin, `CREATE TABLE IF NOT EXISTS "${table}_effects" (marker text)`);
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        let runs = 0;
        const failure = await store
          .transaction({ id, token: 't' }, async (tx) => {
            runs++;
            await tx.query(`INSERT INTO "${table}_effects" (marker) VALUES ($1)`, [marker]);
            expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
            return { value: 'ok', response: done(), retentionMs: 60_000 };
          })
          .catch((error: unknown) => error);
        expect(failure).toBeInstanceOf(StoreUnavailableError);
        expect((failure as Error).cause).toMatchObject({ code: '40001' });
        expect(runs).toBe(1);
        expect(
          await sql(admin, `SELECT count(*)::int AS n FROM "${table}_effects" WHERE marker = $1`, [marker]),
        ).toEqual([{ n: 0 }]);
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
      });
    });
  });

  describePostgresBehaviour('a pg Pool', async () => {
    const pool = testPool();
    return { client: pool, close: () => pool.end() };
  });

  describePostgresBehaviour('a single pg Client', async () => {
    const client = new pg.Client({ connectionString: databaseUrl });
    client.on('error', () => undefined);
    await client.connect();
    return { client, close: () => client.end() };
  });

  describe('pg specifics', () => {
    let pool: pg.Pool;
    let table: string;
    let drop: () => Promise<void>;
    let store: PostgresStore;

    beforeAll(async () => {
      pool = testPool();
      ({ table, drop } = await freshTable(pool, 'pg_specifics'));
      store = postgresStore({ client: pool, table });
    });
    afterAll(async () => {
      await drop();
      await pool.end();
    });

    // A transaction of executor 'slow' that writes a marker; meanwhile, on other connections, its
    // lease runs out and `meanwhile` happens. Resolves the result and how many markers committed.
    const slowTransaction = async (id: string, meanwhile: () => Promise<void>) => {
      const marker = randomUUID();
      await sql(pool, `CREATE TABLE IF NOT EXISTS "${table}_effects" (marker text)`);
      await store.claim({ id, token: 'slow', fingerprint: '', leaseMs: 5_000 });
      const result = await store.transaction({ id, token: 'slow' }, async (tx) => {
        await tx.query(`INSERT INTO "${table}_effects" (marker) VALUES ($1)`, [marker]);
        await sql(pool, `UPDATE "${table}" SET expires_at = clock_timestamp() - interval '1 ms' WHERE id = $1`, [id]);
        await meanwhile();
        return { value: 'slow', response: body('slow'), retentionMs: 60_000 };
      });
      const [{ n }] = (await sql(pool, `SELECT count(*)::int AS n FROM "${table}_effects" WHERE marker = $1`, [
        marker,
      ])) as [{ n: number }];
      await sql(pool, `DROP TABLE "${table}_effects"`);
      return { result, markers: n };
    };

    it('a takeover racing a transaction wins and the transaction commits nothing', async () => {
      const id = freshId();
      const { result, markers } = await slowTransaction(id, async () => {
        // Another executor claims the id once the lease ran out.
        expect(await store.claim({ id, token: 'fast', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
      });
      expect(result).toEqual({ committed: false });
      expect(markers).toBe(0);
      expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'fast', fingerprint: '' });
    });

    it('a purge during a transaction whose lease ran out leaves its record, and the transaction commits', async () => {
      const id = freshId();
      // Nobody takes the key over; a purge runs.
      const { result, markers } = await slowTransaction(id, async () => {
        await store.purgeExpired();
      });
      expect(result).toEqual({ committed: true, value: 'slow' });
      expect(markers).toBe(1);
      expect((await store.get(id))?.state).toBe('completed');
    });

    it('a claim blocked by an uncommitted completion waits, then returns the completed record', async () => {
      const id = freshId();
      await store.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
      await sql(pool, `UPDATE "${table}" SET expires_at = clock_timestamp() - interval '1 ms' WHERE id = $1`, [id]);
      // What transactional mode does at its end: the completion holds the row lock until COMMIT.
      const holder = await pool.connect();
      try {
        await holder.query('BEGIN');
        await holder.query(
          `UPDATE "${table}" SET state = 'completed', status = 201, headers = '{}', body = '\\x6f6b',
             expires_at = clock_timestamp() + interval '1 minute' WHERE id = $1 AND token = 't'`,
          [id],
        );
        // The lease looked expired when this claim started, so it must wait for the lock, not take over.
        const contender = store.claim({ id, token: 'other', fingerprint: 'fp', leaseMs: 5_000 });
        const early = await Promise.race([
          contender.then(() => 'settled'),
          new Promise((r) => setTimeout(r, 200, 'waiting')),
        ]);
        expect(early).toBe('waiting');
        await holder.query('COMMIT');
        const claimed = await contender;
        expect(claimed.claimed).toBe(false);
        if (!claimed.claimed) {
          expect(claimed.record.state).toBe('completed');
          if (claimed.record.state === 'completed')
            expect(new TextDecoder().decode(claimed.record.response.body)).toBe('ok');
        }
      } finally {
        holder.release();
      }
    });

    it('a claim that finds a live record is a plain read: it does not wait for a row lock', async () => {
      const id = freshId();
      await store.claim({ id, token: 'holder', fingerprint: 'fp', leaseMs: 5_000 });
      const locker = await pool.connect();
      try {
        await locker.query('BEGIN');
        await locker.query(`SELECT 1 FROM "${table}" WHERE id = $1 FOR UPDATE`, [id]);
        // Replays and 409s must not queue behind a hot key's lock (nor write WAL and flush a commit).
        const contender = store.claim({ id, token: 'other', fingerprint: 'fp', leaseMs: 5_000 });
        const settled = await Promise.race([contender, new Promise((r) => setTimeout(r, 1_000, 'blocked'))]);
        expect(settled).toEqual({
          claimed: false,
          record: { state: 'in_progress', token: 'holder', fingerprint: 'fp' },
        });
      } finally {
        await locker.query('ROLLBACK');
        locker.release();
      }
    });

    it('a statement stuck behind a lock times out as StoreUnavailableError (statement_timeout and query_timeout)', async () => {
      const id = freshId();
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
      await sql(pool, `UPDATE "${table}" SET expires_at = clock_timestamp() - interval '1 ms' WHERE id = $1`, [id]);
      const locker = await pool.connect();
      const serverSide = testPool({ max: 1, statement_timeout: 300 });
      const clientSide = testPool({ max: 1, query_timeout: 300 });
      try {
        await locker.query('BEGIN');
        await locker.query(`UPDATE "${table}" SET token = token WHERE id = $1`, [id]);
        for (const client of [serverSide, clientSide]) {
          const stuck = postgresStore({ client, table });
          const began = performance.now();
          const failure = await stuck
            .claim({ id, token: 'u', fingerprint: '', leaseMs: 5_000 })
            .catch((e: unknown) => e);
          expect(failure).toBeInstanceOf(StoreUnavailableError);
          expect(performance.now() - began).toBeLessThan(3_000);
        }
      } finally {
        await locker.query('ROLLBACK');
        locker.release();
        await serverSide.end();
        await clientSide.end();
      }
    });

    it('the pool connection of a transaction goes back to the pool, or is destroyed when broken', async () => {
      const before = pool.totalCount;
      const id = freshId();
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
      const failure = await store
        .transaction({ id, token: 't' }, async (tx) => {
          await tx.query('SELECT pg_terminate_backend(pg_backend_pid())').catch(() => undefined);
          await tx.query('SELECT 1');
          return { value: 1, response: body('x'), retentionMs: 60_000 };
        })
        .catch((error: unknown) => error);
      expect(failure).toBeInstanceOf(StoreUnavailableError);
      expect(pool.totalCount).toBeLessThanOrEqual(before);
      // The pool keeps working with fresh connections.
      expect((await store.get(id))?.state).toBe('in_progress');
    });

    it('on a single Client, calls made during a transaction wait for it instead of joining it', async () => {
      const client = new pg.Client({ connectionString: databaseUrl });
      client.on('error', () => undefined);
      await client.connect();
      try {
        const single = postgresStore({ client, table });
        const id = freshId();
        const other = freshId();
        await single.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        let sideClaim: Promise<unknown> | undefined;
        const failure = await single
          .transaction({ id, token: 't' }, async (tx) => {
            sideClaim = single.claim({ id: other, token: 'side', fingerprint: '', leaseMs: 5_000 });
            await tx.query('SELECT 1');
            throw new Error('handler failed');
          })
          .catch((error: unknown) => error);
        expect((failure as Error).message).toBe('handler failed');
        expect(await sideClaim).toEqual({ claimed: true });
        // Had the side claim run inside the transaction, the rollback would have erased it.
        expect(await single.get(other)).toEqual({ state: 'in_progress', token: 'side', fingerprint: '' });
      } finally {
        await client.end();
      }
    });

    it('migrate() of one table named two ways at once: the second waits for the first, and both succeed', async () => {
      const name = uniqueTable('migrate_race');
      const applicationName = `idem-migrate-race-${randomUUID().slice(0, 8)}`;
      // The first migration runs on a client that stops right after its CREATE TABLE, inside the
      // transaction: the new table's catalog rows are written and not yet committed.
      const first = new pg.Client({ connectionString: databaseUrl });
      first.on('error', () => undefined);
      await first.connect();
      let created!: () => void;
      const tableCreated = new Promise<void>((resolve) => {
        created = resolve;
      });
      let resume!: () => void;
      const resumed = new Promise<void>((resolve) => {
        resume = resolve;
      });
      const stopping: PgClientLike = {
        query: async (config) => {
          const result = await first.query(config);
          if (config.text.startsWith('CREATE TABLE')) {
            created();
            await resumed;
          }
          return result;
        },
      };
      const second = testPool({ max: 1, application_name: applicationName });
      try {
        const firstRun = migrate(stopping, { table: `public.${name}` });
        await tableCreated;
        const secondRun = migrate(second, { table: name }).then(
          () => 'migrated',
          (error: unknown) => error,
        );
        // Wait until the second run is blocked on a lock (the advisory lock, or the catalog row).
        for (let waiting = 0; waiting === 0; ) {
          const rows = await sql(
            pool,
            `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`,
            [applicationName],
          );
          waiting = rows[0].n;
          if (waiting === 0) await new Promise((resolve) => setTimeout(resolve, 10));
        }
        resume();
        await firstRun;
        expect(await secondRun).toBe('migrated');
      } finally {
        resume();
        await sql(pool, `DROP TABLE IF EXISTS "${name}"`);
        await first.end();
        await second.end();
      }
    });

    it('migrate() on an existing table needs no DDL rights: a role that may only read and write it can run it', async () => {
      const name = uniqueTable('migrate_role');
      const role = `idem_test_role_${randomUUID().slice(0, 8)}`;
      await migrate(pool, { table: name });
      await sql(pool, `CREATE ROLE "${role}" LOGIN`);
      await sql(pool, `GRANT SELECT, INSERT, UPDATE, DELETE ON "${name}" TO "${role}"`);
      const url = new URL(databaseUrl);
      url.username = role;
      url.password = '';
      const restricted = testPool({ connectionString: url.toString(), max: 2 });
      try {
        await migrate(restricted, { table: name });
        const store = postgresStore({ client: restricted, table: name });
        expect(await store.claim({ id: freshId(), token: 't', fingerprint: '', leaseMs: 5_000 })).toEqual({
          claimed: true,
        });
      } finally {
        await restricted.end();
        await sql(pool, `DROP TABLE IF EXISTS "${name}"`);
        await sql(pool, `DROP ROLE IF EXISTS "${role}"`);
      }
    });

    it('a purge with fewer expired records than a batch stops at the first live one of the expires_at index', async () => {
      // clock_timestamp() written bare cannot bound an index scan: the batch's scan then read every
      // live record of the index, in order, to find the few expired ones (the steady state of a timer).
      const { table: probe, drop: dropProbe } = await freshTable(pool, 'pg_purge_plan');
      try {
        await sql(
          pool,
          `INSERT INTO "${probe}" (id, state, token, fingerprint, status, headers, body, expires_at)
           SELECT prefix || g, 'completed', 't', '', 200, '{}', '\\x', clock_timestamp() + shift
           FROM generate_series(1, $1::int) g,
                (VALUES ('live-', interval '1 hour'), ('gone-', interval '-1 hour')) AS kinds(prefix, shift)
           WHERE prefix = 'live-' OR g <= 5`,
          [20_000],
        );
        await sql(pool, `ANALYZE "${probe}"`);
        const { purge } = buildStatements(parseTableName(probe), 'plan', { statusMessage: true });
        const [row] = await sql(pool, `EXPLAIN (ANALYZE, FORMAT JSON) ${purge.text}`, [1000, 60_000]);
        const scans: Array<Record<string, unknown>> = [];
        const walk = (node: Record<string, unknown>) => {
          if (String(node['Index Name'] ?? '').endsWith('_expires_at')) scans.push(node);
          for (const child of (node.Plans as Array<Record<string, unknown>> | undefined) ?? []) walk(child);
        };
        walk(row['QUERY PLAN'][0].Plan);
        expect(scans.length).toBeGreaterThan(0);
        for (const scan of scans) {
          expect(scan['Index Cond']).toMatch(/expires_at <=/);
          expect(Number(scan['Rows Removed by Filter'] ?? 0)).toBeLessThan(100);
        }
        expect(await sql(pool, `SELECT count(*)::int AS n FROM "${probe}" WHERE id LIKE 'gone-%'`)).toEqual([{ n: 0 }]);
      } finally {
        await dropProbe();
      }
    });

    it('a purge skips rows another session holds locked instead of waiting for them', async () => {
      const held = freshId();
      const free = freshId();
      for (const id of [held, free]) {
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await store.complete({ id, token: 't', response: body('done'), retentionMs: 60_000 });
        await sql(pool, `UPDATE "${table}" SET expires_at = clock_timestamp() - interval '1 ms' WHERE id = $1`, [id]);
      }
      const locker = await pool.connect();
      let purging: Promise<number> | undefined;
      try {
        // A claim taking the row over right now holds exactly this lock.
        await locker.query('BEGIN');
        await locker.query(`SELECT 1 FROM "${table}" WHERE id = $1 FOR UPDATE`, [held]);
        purging = store.purgeExpired();
        const settled = await Promise.race([purging, new Promise((r) => setTimeout(r, 1_000, 'blocked'))]);
        expect(settled).not.toBe('blocked');
        expect(await sql(pool, `SELECT id FROM "${table}" WHERE id = ANY($1) ORDER BY id`, [[held, free]])).toEqual([
          { id: held },
        ]);
      } finally {
        await locker.query('ROLLBACK');
        locker.release();
        await purging;
      }
    });

    it('two stores on two tables share one Client, prepared statements and all, each on its own table', async () => {
      // Statement names carry a hash of the table: pg refuses a second text under a name already
      // prepared on the connection, and a store must never run another table's statement.
      const { table: second, drop: dropSecond } = await freshTable(pool, 'pg_second');
      const client = new pg.Client({ connectionString: databaseUrl });
      client.on('error', () => undefined);
      await client.connect();
      try {
        const first = postgresStore({ client, table });
        const other = postgresStore({ client, table: second });
        const id = freshId();
        expect(await first.claim({ id, token: 'first', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
        expect(await other.claim({ id, token: 'other', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
        expect((await first.get(id))?.token).toBe('first');
        expect((await other.get(id))?.token).toBe('other');
      } finally {
        await client.end();
        await dropSecond();
      }
    });

    it('prepares its statements on the connection by default, and none with preparedStatements: false', async () => {
      const prepared = async (client: pg.Client | pg.Pool) =>
        (await sql(client, `SELECT name FROM pg_prepared_statements WHERE name LIKE 'idem\\_%'`)).map((r) => r.name);
      // A single Client, and a Pool of one connection, so the check reads the connection the store used.
      const single = new pg.Client({ connectionString: databaseUrl });
      single.on('error', () => undefined);
      await single.connect();
      const onePool = testPool({ max: 1 });
      try {
        for (const client of [single, onePool]) {
          await postgresStore({ client, table, preparedStatements: false }).get(freshId());
          expect(await prepared(client)).toEqual([]);
          await postgresStore({ client, table }).get(freshId());
          // The get, and the one read of the catalog for the status_message column before it.
          expect((await prepared(client)).sort()).toEqual([
            expect.stringMatching(/^idem_get_[0-9a-f]{12}$/),
            expect.stringMatching(/^idem_phrase_column_[0-9a-f]{12}$/),
          ]);
        }
      } finally {
        await single.end();
        await onePool.end();
      }
    });

    it('destroys a transaction connection whose rollback failed, rather than handing it back mid-transaction', async () => {
      // The handler's statement waits on a lock past query_timeout; the ROLLBACK behind it times out
      // too, so the connection is still inside the transaction. Back in the pool, the next request
      // would queue behind the stuck statement and then run inside that transaction.
      const id = freshId();
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
      await sql(pool, `CREATE TABLE IF NOT EXISTS "${table}_effects" (marker text)`);
      await sql(pool, `INSERT INTO "${table}_effects" (marker) VALUES ('locked')`);
      const impatient = testPool({ max: 1, query_timeout: 300 });
      const locker = await pool.connect();
      try {
        await locker.query('BEGIN');
        await locker.query(`SELECT 1 FROM "${table}_effects" FOR UPDATE`);
        const timed = postgresStore({ client: impatient, table });
        const failure = await timed
          .transaction({ id, token: 't' }, async (tx) => {
            await tx.query(`UPDATE "${table}_effects" SET marker = 'changed'`);
            return { value: 1, response: body('x'), retentionMs: 60_000 };
          })
          .catch((error: unknown) => error);
        expect(failure).toBeInstanceOf(StoreUnavailableError);
        expect(impatient.totalCount).toBe(0);
        // With the lock still held, the pool answers at once, on a fresh connection.
        expect(await timed.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
      } finally {
        await locker.query('ROLLBACK');
        locker.release();
        await impatient.end();
        await sql(pool, `DROP TABLE IF EXISTS "${table}_effects"`);
      }
    });

    it('on a single Client, a call of another store made during a transaction waits for it too', async () => {
      // The turn queue belongs to the Client, not to one store: two stores (or a store and migrate())
      // on one connection must not slip statements into each other's transactions.
      const client = new pg.Client({ connectionString: databaseUrl });
      client.on('error', () => undefined);
      await client.connect();
      try {
        const first = postgresStore({ client, table });
        const second = postgresStore({ client, table });
        const id = freshId();
        const other = freshId();
        await first.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        let sideClaim: Promise<unknown> | undefined;
        const failure = await first
          .transaction({ id, token: 't' }, async (tx) => {
            sideClaim = second.claim({ id: other, token: 'side', fingerprint: '', leaseMs: 5_000 });
            await tx.query('SELECT 1');
            throw new Error('handler failed');
          })
          .catch((error: unknown) => error);
        expect((failure as Error).message).toBe('handler failed');
        expect(await sideClaim).toEqual({ claimed: true });
        expect(await second.get(other)).toEqual({ state: 'in_progress', token: 'side', fingerprint: '' });
      } finally {
        await client.end();
      }
    });

    it('a single Client whose connection died answers every call, transactions included, with StoreUnavailableError', async () => {
      const client = new pg.Client({ connectionString: databaseUrl });
      // `on`, not `once`: a terminated backend can make pg emit 'error' twice (the FATAL, then
      // "Connection terminated unexpectedly"), and a second one with no listener is uncaught.
      const died = new Promise((resolve) => client.on('error', resolve));
      await client.connect();
      const single = postgresStore({ client, table });
      const [{ pid }] = (await sql(client, 'SELECT pg_backend_pid() AS pid')) as [{ pid: number }];
      await sql(pool, 'SELECT pg_terminate_backend($1)', [pid]);
      await died;
      const id = freshId();
      for (const call of [
        single.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 }),
        single.get(id),
        single.transaction({ id, token: 't' }, async () => ({ value: 1, response: body('x'), retentionMs: 60_000 })),
      ]) {
        await expect(call).rejects.toBeInstanceOf(StoreUnavailableError);
      }
      await client.end().catch(() => undefined);
    });

    it('migrate() does not count an invalid index on expires_at, as a failed concurrent build leaves one', async () => {
      const name = uniqueTable('invalid_index');
      await migrate(pool, { table: name });
      try {
        await sql(pool, `DROP INDEX "${name}_expires_at"`);
        // Two rows with one expiry: a unique build fails, and CONCURRENTLY leaves its index behind, invalid.
        await sql(
          pool,
          `INSERT INTO "${name}" (id, state, token, fingerprint, expires_at)
           SELECT 'r' || g, 'in_progress', 't', '', timestamptz '2000-01-01' FROM generate_series(1, 2) AS g`,
        );
        await expect(
          sql(pool, `CREATE UNIQUE INDEX CONCURRENTLY "${name}_broken" ON "${name}" (expires_at)`),
        ).rejects.toMatchObject({ code: '23505' });
        await migrate(pool, { table: name });
        const valid = await sql(
          pool,
          `SELECT count(*)::int AS n FROM pg_index x
             JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
            WHERE x.indrelid = to_regclass($1) AND a.attname = 'expires_at' AND x.indisvalid`,
          [name],
        );
        expect(valid).toEqual([{ n: 1 }]);
      } finally {
        await sql(pool, `DROP TABLE IF EXISTS "${name}"`);
      }
    });

    it('works in another schema with a qualified table name and without prepared statements', async () => {
      const schema = `idem_schema_${randomUUID().slice(0, 8)}`;
      await sql(pool, `CREATE SCHEMA "${schema}"`);
      try {
        await migrate(pool, { table: `${schema}.records` });
        const scoped = postgresStore({ client: pool, table: `${schema}.records`, preparedStatements: false });
        const id = freshId();
        expect(await scoped.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
        expect(await sql(pool, `SELECT count(*)::int AS n FROM "${schema}"."records"`)).toEqual([{ n: 1 }]);
        expect(await store.get(id)).toBeUndefined();
      } finally {
        await sql(pool, `DROP SCHEMA "${schema}" CASCADE`);
      }
    });
    // A named statement keeps the result types it was prepared with: PostgreSQL refuses to run it
    // once a column it returns has another type (0A000, "cached plan must not change result type").
    // A type the catalog accepts (varchar without a length, or text again after a spell of another
    // type during which a connection prepared the get) failed the same way after every recheck, on
    // every connection that prepared the get before.
    // Was wrong: the store stopped giving back phrases on get() and, for 30 s after each such get,
    // stopped storing and replaying them, until the process restarted. The get reads the column as
    // text now, so its result type never changes.
    it('a running store whose status_message becomes varchar without a length keeps its phrases', async () => {
      const name = uniqueTable('phrase_varchar');
      const client = new pg.Client({ connectionString: databaseUrl });
      client.on('error', () => undefined);
      await client.connect();
      try {
        await migrate(client, { table: name });
        const running = postgresStore({ client, table: name });
        const completed = async () => {
          const id = freshId();
          await running.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
          const response = { ...body('ok'), status: 201, statusMessage: 'Fine' };
          await running.complete({ id, token: 't', response, retentionMs: 60_000 });
          return id;
        };
        const phrase = async (id: string) => {
          const record = await running.get(id);
          return record?.state === 'completed' ? record.response.statusMessage : record?.state;
        };
        expect(await phrase(await completed())).toBe('Fine');
        await sql(client, `ALTER TABLE "${name}" ALTER COLUMN status_message TYPE varchar`);
        expect(await phrase(await completed())).toBe('Fine');
      } finally {
        await sql(client, `DROP TABLE IF EXISTS "${name}"`);
        await client.end();
      }
    });
  });

  describe('unreachable server', () => {
    let port: number;
    let closed: net.Server;
    beforeAll(async () => {
      // A port that was just free: connecting to it is refused.
      closed = net.createServer();
      await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
      port = (closed.address() as net.AddressInfo).port;
      await new Promise<void>((resolve) => closed.close(() => resolve()));
    });

    it('rejects every operation with StoreUnavailableError, quickly and without unhandled errors', async () => {
      const pool = new pg.Pool({
        host: '127.0.0.1',
        port,
        user: 'postgres',
        database: 'test',
        connectionTimeoutMillis: 1000,
      });
      pool.on('error', () => undefined);
      const store = postgresStore({ client: pool, table: 'idem_records' });
      const id = freshId();
      const calls: Array<Promise<unknown>> = [
        store.claim({ id, token: 't', fingerprint: '', leaseMs: 1_000 }),
        store.renew({ id, token: 't', leaseMs: 1_000 }),
        store.complete({ id, token: 't', response: body('x'), retentionMs: 1_000 }),
        store.release({ id, token: 't' }),
        store.forget({ id, token: 't' }),
        store.get(id),
        store.purgeExpired(),
        store.transaction({ id, token: 't' }, async () => ({ value: 1, response: body('x'), retentionMs: 1_000 })),
        migrate(pool, { table: 'idem_records' }),
      ];
      for (const call of calls) {
        const error = await call.then(
          () => undefined,
          (failure: unknown) => failure,
        );
        expect(error).toBeInstanceOf(StoreUnavailableError);
        expect((error as Error).message).not.toContain(id);
      }
      await pool.end();
    });
  });
});
