// Audit (upgrade path): migrate() run by the new version's first instance on a records table made
// by an earlier version (before `lease_until`), while the earlier version's instances still serve
// from it. Adding the column rewrites nothing, but ALTER TABLE needs an ACCESS EXCLUSIVE lock: it
// waits for every transaction open on the table (a transactional handler holds one for its whole
// run), and every statement on the table queues behind it meanwhile.
import { setTimeout as delay } from 'node:timers/promises';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrate } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './database.js';

// The records table as commit 121bd6d (and every version before lease_until) made it.
const oldTable = (table: string) => [
  `CREATE TABLE "${table}" (
    id text PRIMARY KEY, state text NOT NULL CHECK (state IN ('in_progress', 'completed')), token text NOT NULL,
    fingerprint text NOT NULL, status integer, headers jsonb, body bytea, expires_at timestamptz NOT NULL)`,
  `CREATE INDEX "${table}_expires_at" ON "${table}" (expires_at)`,
  `INSERT INTO "${table}" VALUES ('replayed', 'completed', 't1', 'fp', 201, '{}', '\\x6f6b', now() + interval '1 day'),
                                 ('running', 'in_progress', 't2', 'fp', NULL, NULL, NULL, now() + interval '10 seconds')`,
];
// The earlier version's read of a live record (its `get`), as a replay or a 409 runs it.
const oldGet = (table: string) =>
  `SELECT state, token, fingerprint, status, headers, body FROM "${table}" WHERE id = $1 AND expires_at > clock_timestamp()`;

describe.runIf(await postgresAvailable())(
  'migrate() of a table made before lease_until, during a rolling deploy',
  () => {
    let pool: pg.Pool;
    const tables: string[] = [];
    beforeAll(() => {
      pool = testPool();
    });
    afterAll(async () => {
      for (const table of tables) await pool.query(`DROP TABLE IF EXISTS "${table}"`);
      await pool.end();
    });

    /** The old table, and an earlier-version transactional handler mid-run: its claim's row locked. */
    const setUp = async (label: string) => {
      const table = uniqueTable(label);
      tables.push(table);
      for (const statement of oldTable(table)) await pool.query(statement);
      const handler = await pool.connect();
      await handler.query('BEGIN');
      await handler.query(`SELECT 1 FROM "${table}" WHERE id = 'running' FOR UPDATE`);
      return { table, handler };
    };
    // Until a backend waits for a lock on the table to run DDL on it.
    const waitForBlockedAlter = async () => {
      for (;;) {
        const { rows } = await pool.query(
          `SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query ILIKE 'ALTER TABLE%lease_until%'`,
        );
        if (rows.length > 0) return;
        await delay(10);
      }
    };
    const within = <T>(ms: number, promise: Promise<T>) =>
      Promise.race([promise.then(() => 'answered' as const), delay(ms).then(() => 'still waiting' as const)]);

    // Was a defect: migrate() ran the ALTER TABLE with no lock_timeout (in its own transaction, on a
    // connection of the pool it is given, so a caller's `SET lock_timeout` on a pool never reaches
    // it). While one of the earlier version's transactional handlers is running, the ALTER waits, and
    // every replay, 409 and claim of every instance waits behind it: the whole service stalls for as
    // long as the longest open transaction on the table (up to a lease, or a stuck session's
    // idle_in_transaction timeout). docs/stores.md said only that the column "changes the catalog
    // only and rewrites nothing"; it now gives the lock_timeout recipe the outbox's docs give (see
    // the next test). Whether migrate() should take a short lock_timeout itself and retry (and
    // whether to fail the boot after N tries) is the decision left. Decided: each try of a change to an
    // existing table waits at most `lockTimeout` (default 500 ms) for its lock, then gives up, frees
    // the queue and tries again after a pause, for up to `lockWait` (default 30 s) in all.
    it('a replay on the earlier version is not held up while migrate() waits for its open transaction', async () => {
      const { table, handler } = await setUp('upgrade_lock');
      const migrating = migrate(pool, { table });
      try {
        await waitForBlockedAlter();
        const replay = pool.query(oldGet(table), ['replayed']);
        const answer = await within(1_500, replay);
        await handler.query('COMMIT');
        await replay;
        expect(answer).toBe('answered');
      } finally {
        await handler.query('COMMIT').catch(() => undefined);
        handler.release();
        await migrating;
      }
    });

    it('migrate() gives up after lockWait (55P03) having changed nothing, without stalling the table, and succeeds once run again', async () => {
      const { table, handler } = await setUp('upgrade_lock_timeout');
      const migrator = await pool.connect();
      try {
        // Two tries of 150 ms (the pause between them is 250 ms), then the 500 ms are spent.
        const migrating = migrate(migrator, { table, lockTimeout: '150ms', lockWait: '500ms' });
        await waitForBlockedAlter();
        // Queued behind the ALTER, but only until the ALTER gives up.
        const replay = pool.query(oldGet(table), ['replayed']);
        const refused = await migrating.then(
          () => 'migrated',
          (error: { code?: string; cause?: { code?: string } }) => `${error.code} ${error.cause?.code}`,
        );
        // A StoreUnavailableError, as for any lock_timeout, with PostgreSQL's error as its cause.
        expect(refused).toBe('store_unavailable 55P03');
        expect((await replay).rows[0]).toMatchObject({ state: 'completed', status: 201 });
        await handler.query('COMMIT');
        await migrate(migrator, { table });
        const { rows } = await pool.query(
          `SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'lease_until' AND NOT attisdropped`,
          [`"${table}"`],
        );
        expect(rows).toHaveLength(1);
      } finally {
        await handler.query('COMMIT').catch(() => undefined);
        handler.release();
        migrator.release(true);
      }
    });

    it('with lockTimeout false, migrate() waits for the open transaction as long as it takes', async () => {
      const { table, handler } = await setUp('upgrade_lock_wait');
      try {
        // Still waiting well past lockWait and past what the default lockTimeout (500 ms) would give
        // up at: a `false` read as the default, or a lockWait applied anyway, has rejected by then.
        const migrating = migrate(pool, { table, lockTimeout: false, lockWait: '100ms' });
        await waitForBlockedAlter();
        expect(await within(800, migrating)).toBe('still waiting');
        await handler.query('COMMIT');
        await migrating;
      } finally {
        await handler.query('COMMIT').catch(() => undefined);
        handler.release();
      }
    });
  },
);
