// Closing the resource stack while its purge pass works through a backlog of old outbox events (the
// first pass after an upgrade: the outbox used to keep every delivered event for good). close() waits
// for the statement under way, so none is cut by the database closing; it must not wait for the rest
// of the backlog, batch after batch, which a process manager's stop timeout would end with a SIGKILL.
// Real PostgreSQL (DATABASE_URL): another session's lock holds the purge's first outbox DELETE for as
// long as the test wants, without any sleep.
import { randomBytes } from 'node:crypto';
import { exportJWK, generateKeyPair } from 'jose';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startResourceStack } from '../src/api/resource-stack.js';
import { type Database, openDatabase } from '../src/db.js';
import { apiTables, migrateApi } from '../src/schema/api-schema.js';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = `purge_stop_${randomBytes(5).toString('hex')}`;

describe('the resource stack closing while its purge works through an outbox backlog (review)', () => {
  let db: Database;
  const locker = new pg.Client({ connectionString: databaseUrl });
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

  const blocked = async () =>
    (
      await observer.query<{ pid: number; query: string }>(
        'select pid, query from pg_stat_activity where $1::int = any(pg_blocking_pids(pid))',
        [lockerPid],
      )
    ).rows;

  it('stops after the batch under way instead of deleting the whole backlog before close() resolves', async () => {
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
      written.push(String(chunk));
      return true;
    });
    const outbox = `${schema}.${apiTables.outbox}`;
    try {
      const pair = await generateKeyPair('ES256');
      const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'purge-stop', alg: 'ES256' };
      await migrateApi(db);
      // Five batches of the pass's 1,000 rows, delivered 8 days ago (the app keeps them 7), written
      // before the stack starts; then the lock, so its first outbox DELETE waits.
      await db.query(
        `insert into ${outbox} (id, url, body, status, created_at, delivered_at)
         select 'evt_' || lpad(g::text, 6, '0'), 'http://receiver.test/', '\\x7b7d', 'delivered',
                now() - interval '9 days', now() - interval '8 days'
           from generate_series(1, 5000) g`,
      );
      await locker.query('begin');
      await locker.query(`lock table ${outbox} in share mode`);
      const stack = await startResourceStack({
        db,
        gatewayPort: 0,
        apiPort: 0,
        receiverPort: 0,
        baseUrl: 'http://gateway.purge-stop-test',
        issuers: [{ issuer: 'https://issuer.purge-stop-test.example', jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
        relay: false,
        seed: false,
        purgeEveryMs: 50,
      });
      let held: Array<{ pid: number; query: string }> = [];
      for (let turn = 0; turn < 400; turn++) {
        held = (await blocked()).filter((row) => /^DELETE FROM/.test(row.query));
        if (held.length > 0) break;
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      expect(held).toHaveLength(1);
      const closing = stack.close();
      // close() has begun (its servers close in a few turns) before the lock goes.
      for (let turn = 0; turn < 10; turn++) await new Promise((resolve) => setTimeout(resolve, 10));
      await locker.query('commit');
      await closing;
      const { rows } = await db.query<{ n: string }>(`select count(*) as n from ${outbox}`);
      // The batch that was waiting went (1,000 rows); the next four are the next pass's.
      expect(Number(rows[0]?.n)).toBeGreaterThanOrEqual(3_000);
    } finally {
      stderr.mockRestore();
      await locker.query('rollback').catch(() => undefined);
    }
    expect(written.filter((line) => line.includes('deleting expired'))).toEqual([]);
  });
});
