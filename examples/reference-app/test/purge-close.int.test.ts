// Closing the resource stack while its purge of expired idempotency records is under way: the purge
// must finish (or fail on its own) before close() resolves, so the caller's next step (closing the
// database) never cuts a DELETE in the middle and prints a failure for a pass that had no fault.
// On a real PostgreSQL (DATABASE_URL): another session holds a lock on the first table the purge
// walks, so the pass is caught mid-way for as long as the test wants, without any sleep.
import { randomBytes } from 'node:crypto';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import { exportJWK, generateKeyPair } from 'jose';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { outboxKept, startResourceStack } from '../src/api/resource-stack.js';
import { type Database, openDatabase } from '../src/db.js';
import { apiTables, migrateApi } from '../src/schema/api-schema.js';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
// Asked first: without PostgreSQL these tests are skipped with a warning (failed under CI=true), as
// the README promises, not failed on ECONNREFUSED in a hook.
const available = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the purge-close tests',
);
const schema = `purge_close_${randomBytes(5).toString('hex')}`;

describe.runIf(available)('the resource stack closing during a purge pass', () => {
  let db: Database;
  const locker = new pg.Client({ connectionString: databaseUrl });
  // A session of its own: inside the locker's transaction, pg_stat_activity would be read once and
  // kept (statistics are a snapshot per transaction).
  const observer = new pg.Client({ connectionString: databaseUrl });
  let lockerPid = 0;

  beforeAll(async () => {
    db = await openDatabase({ url: databaseUrl, schema });
    await locker.connect();
    await observer.connect();
    lockerPid = (await locker.query<{ pid: number }>('select pg_backend_pid() as pid')).rows[0]?.pid ?? 0;
  });

  afterAll(async () => {
    await locker.end().catch(() => undefined);
    await observer.end().catch(() => undefined);
    await db?.query(`drop schema if exists ${schema} cascade`);
    await db?.close();
  });

  // The sessions the locker holds up: the purge's DELETE, as PostgreSQL sees it.
  const blocked = async () => {
    const { rows } = await observer.query<{ pid: number }>(
      'select pid from pg_stat_activity where $1::int = any(pg_blocking_pids(pid))',
      [lockerPid],
    );
    return rows.map((row) => row.pid);
  };

  // The stack with no relay and no seed, purging every 50 ms.
  const startIdleStack = async () => {
    const pair = await generateKeyPair('ES256');
    const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'purge-close', alg: 'ES256' };
    return startResourceStack({
      db,
      gatewayPort: 0,
      apiPort: 0,
      receiverPort: 0,
      baseUrl: 'http://gateway.purge-close-test',
      issuers: [{ issuer: 'https://issuer.purge-close-test.example', jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
      relay: false,
      seed: false,
      purgeEveryMs: 50,
    });
  };

  it('waits for the pass under way before it resolves, and the pass ends without an error', async () => {
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
      written.push(String(chunk));
      return true;
    });
    try {
      const stack = await startIdleStack();
      // SHARE blocks the purge's DELETE and nothing else the idle stack does. A pass runs every 50 ms:
      // the next one after the lock is caught.
      await locker.query('begin');
      await locker.query(`lock table ${schema}.${apiTables.idempotency} in share mode`);
      for (let turn = 0; turn < 400 && (await blocked()).length === 0; turn++) {
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      const purging = await blocked();
      expect(purging).toHaveLength(1);
      const { rows: held } = await observer.query<{ query: string }>(
        'select query from pg_stat_activity where pid = $1',
        [purging[0]],
      );
      expect(held[0]?.query).toMatch(/^DELETE FROM "api_idempotency_records"/);

      let closed = false;
      const closing = stack.close().then(() => {
        closed = true;
      });
      // The servers close in a few turns; the close as a whole must not, while the DELETE waits.
      for (let turn = 0; turn < 20; turn++) await new Promise((resolve) => setTimeout(resolve, 10));
      expect(await blocked()).toEqual(purging);
      expect(closed).toBe(false);

      await locker.query('rollback');
      await closing;
      // Nothing of the pass is left running on the database once close() resolved.
      const { rows: after } = await observer.query<{ state: string }>(
        'select state from pg_stat_activity where pid = $1',
        [purging[0]],
      );
      expect(after[0]?.state).toBe('idle');
    } finally {
      stderr.mockRestore();
      await locker.query('rollback').catch(() => undefined);
    }
    expect(written.filter((line) => line.includes('deleting expired'))).toEqual([]);
  });

  it('deletes old delivered and dead webhook events from the outbox, and nothing else', async () => {
    expect(outboxKept).toEqual({ delivered: '7d', dead: '30d' });
    const outbox = `${schema}.${apiTables.outbox}`;
    const stack = await startIdleStack();
    try {
      // Ages set in SQL, on the database's clock, which the purge measures with.
      const rows: Array<[string, string, string]> = [
        ['delivered-8d', 'delivered', `delivered_at = now() - interval '8 days'`],
        ['delivered-6d', 'delivered', `delivered_at = now() - interval '6 days'`],
        // Dead 31 and 29 days ago, after a year of retries: when they died is what counts.
        ['dead-31d', 'dead', `created_at = now() - interval '400 days', dead_at = now() - interval '31 days'`],
        ['dead-29d', 'dead', `created_at = now() - interval '400 days', dead_at = now() - interval '29 days'`],
        // Dead before the outbox kept dead_at: aged from its last scheduled attempt.
        [
          'dead-before-31d',
          'dead',
          `created_at = now() - interval '400 days', next_attempt_at = now() - interval '31 days'`,
        ],
        [
          'dead-before-2d',
          'dead',
          `created_at = now() - interval '400 days', next_attempt_at = now() - interval '2 days'`,
        ],
        ['pending-40d', 'pending', `created_at = now() - interval '40 days'`],
      ];
      for (const [id, status, age] of rows) {
        await db.query(
          `insert into ${outbox} (id, url, body, status, delivered_at) values ($1, 'http://receiver.test/', '\\x7b7d', $2, null)`,
          [id, status],
        );
        await db.query(`update ${outbox} set ${age} where id = $1`, [id]);
      }
      const left = async () =>
        (await db.query<{ id: string }>(`select id from ${outbox} order by id`)).rows.map((row) => row.id);
      for (let turn = 0; turn < 400 && (await left()).length > 4; turn++) {
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      expect(await left()).toEqual(['dead-29d', 'dead-before-2d', 'delivered-6d', 'pending-40d']);
    } finally {
      await stack.close();
    }
  });

  // The first pass after an upgrade works through every event the outbox ever delivered. close() waits
  // for the statement under way, so none is cut by the database closing; it must not wait for the rest
  // of that backlog, batch after batch, which a process manager's stop timeout would end with a SIGKILL.
  it('stops after the batch under way instead of deleting a whole outbox backlog before close() resolves', async () => {
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
      written.push(String(chunk));
      return true;
    });
    const outbox = `${schema}.${apiTables.outbox}`;
    try {
      await migrateApi(db);
      // Five batches of the pass's 1,000 rows, delivered 8 days ago (the app keeps them 7), written
      // before the stack starts; then the lock, so its first outbox DELETE waits.
      await db.query(
        `insert into ${outbox} (id, url, body, status, created_at, delivered_at)
         select 'evt_stop_' || lpad(g::text, 6, '0'), 'http://receiver.test/', '\\x7b7d', 'delivered',
                now() - interval '9 days', now() - interval '8 days'
           from generate_series(1, 5000) g`,
      );
      await locker.query('begin');
      await locker.query(`lock table ${outbox} in share mode`);
      const stack = await startIdleStack();
      let held: string[] = [];
      for (let turn = 0; turn < 400 && held.length === 0; turn++) {
        const { rows } = await observer.query<{ query: string }>(
          'select query from pg_stat_activity where $1::int = any(pg_blocking_pids(pid))',
          [lockerPid],
        );
        held = rows.map((row) => row.query).filter((query) => /^DELETE FROM/.test(query));
        if (held.length === 0) await new Promise((resolve) => setTimeout(resolve, 25));
      }
      expect(held).toHaveLength(1);
      const closing = stack.close();
      // close() has begun (its servers close in a few turns) before the lock goes.
      for (let turn = 0; turn < 10; turn++) await new Promise((resolve) => setTimeout(resolve, 10));
      await locker.query('commit');
      await closing;
      const { rows } = await db.query<{ n: string }>(`select count(*) as n from ${outbox} where id like 'evt_stop_%'`);
      // The batch that was waiting went (1,000 rows); the next four are the next pass's.
      expect(Number(rows[0]?.n)).toBeGreaterThanOrEqual(3_000);
    } finally {
      stderr.mockRestore();
      await locker.query('rollback').catch(() => undefined);
    }
    expect(written.filter((line) => line.includes('deleting expired'))).toEqual([]);
  });
});
