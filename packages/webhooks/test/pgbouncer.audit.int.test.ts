// Audit (branch audit-pgbouncer): the outbox behind a real PgBouncer in transaction mode (each
// transaction may run on another server session) with 2 server connections and more clients than
// that. The outbox must hold nothing in a session: its migrate() is one implicit transaction with a
// transaction-scoped advisory lock and a transaction-local lock_timeout, add() runs in the caller's
// transaction, and each relay statement (claim FOR UPDATE SKIP LOCKED, record, put back) and each
// purge batch is a transaction of its own.
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type PgBouncer, pgBouncerAvailable, startPgBouncer } from '../../testkit/test/audit-support/pgbouncer.js';
import { createOutbox, createSender } from '../src/index.js';
import { databaseUrl, postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = (await postgresAvailable('PgBouncer audit')) && pgBouncerAvailable('the outbox PgBouncer audits');

describe.runIf(available)('the webhook outbox behind PgBouncer in transaction mode', () => {
  let bouncer: PgBouncer;
  // Session pooling: every pg connection keeps a server session while it is open, so its server pool
  // is as large as all the test's pools together.
  let sessionBouncer: PgBouncer;
  const admin = testPool({ max: 2 });
  const pools: pg.Pool[] = [];
  const tables: string[] = [];
  // The receiver: counts each delivery by its webhook-id.
  const deliveries = new Map<string, number>();
  const receiver = createServer((req, res) => {
    const id = String(req.headers['webhook-id']);
    req.resume();
    req.on('end', () => {
      deliveries.set(id, (deliveries.get(id) ?? 0) + 1);
      res.writeHead(204).end();
    });
  });
  let url = '';

  const bouncerPool = (max = 3, through: PgBouncer = bouncer) => {
    const pool = new pg.Pool({ connectionString: through.url, max });
    pool.on('error', () => undefined);
    pools.push(pool);
    return pool;
  };

  const freshOutbox = (label: string) => {
    const table = uniqueTable(label);
    tables.push(table);
    return createOutbox({ table });
  };

  beforeAll(async () => {
    bouncer = await startPgBouncer({ databaseUrl, poolMode: 'transaction', poolSize: 2 });
    sessionBouncer = await startPgBouncer({ databaseUrl, poolMode: 'session', poolSize: 12 });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hooks`;
  });

  afterAll(async () => {
    for (const pool of pools.splice(0)) await pool.end();
    for (const table of tables) await admin.query(`DROP TABLE IF EXISTS "${table}"`);
    await admin.end();
    await bouncer?.stop();
    await sessionBouncer?.stop();
    receiver.closeAllConnections();
    await new Promise<void>((resolve) => receiver.close(() => resolve()));
  });

  it('migrate() from four pools at once creates one table, and leaves no lock_timeout on the server sessions', async () => {
    const outbox = freshOutbox('pgb_migrate');
    const migrating = Array.from({ length: 4 }, () => bouncerPool(2));
    await Promise.all(migrating.map((pool) => outbox.migrate(pool)));
    // A second round finds everything there.
    await Promise.all(migrating.map((pool) => outbox.migrate(pool)));
    const { rows } = await admin.query('SELECT count(*)::int AS n FROM pg_class WHERE relname = $1', [outbox.table]);
    expect(rows[0].n).toBe(1);
    const seen = await Promise.all(
      Array.from({ length: 6 }, async () => {
        const client = await migrating[0]?.connect();
        if (!client) throw new Error('no client');
        try {
          await client.query('BEGIN');
          const result = await client.query(`SELECT current_setting('lock_timeout') AS value`);
          await client.query('COMMIT');
          return result.rows[0].value as string;
        } finally {
          client.release();
        }
      }),
    );
    expect(new Set(seen)).toEqual(new Set(['0']));
  });

  for (const mode of ['transaction', 'session'] as const) {
    it(`${mode} pooling: events added in committed transactions are delivered once each by three relays; a rolled-back one never`, async () => {
      const through = mode === 'session' ? sessionBouncer : bouncer;
      const outbox = freshOutbox(`pgb_relay_${mode}`);
      const producer = bouncerPool(3, through);
      await outbox.migrate(producer);
      const committed: string[] = [];
      const rolledBack = `evt_${randomUUID()}`;
      await Promise.all(
        Array.from({ length: 3 }, async (_, worker) => {
          for (let i = 0; i < 20; i++) {
            const client = await producer.connect();
            try {
              await client.query('BEGIN');
              const id = `evt_${randomUUID()}`;
              await outbox.add(client, { id, url, body: { worker, i } });
              await client.query('COMMIT');
              committed.push(id);
            } finally {
              client.release();
            }
          }
        }),
      );
      const client = await producer.connect();
      try {
        await client.query('BEGIN');
        await outbox.add(client, { id: rolledBack, url, body: { never: true } });
        await client.query('ROLLBACK');
      } finally {
        client.release();
      }

      const sender = createSender({ secret: SECRET, timeout: '5s' });
      const relays = Array.from({ length: 3 }, () =>
        outbox.relay({ db: bouncerPool(3, through), sender, batchSize: 7 }),
      );
      // Rounds until a round of every relay claims nothing: all of them compete for the same rows.
      for (let round = 0; round < 40; round++) {
        const results = await Promise.all(relays.map((relay) => relay.runOnce()));
        if (results.every((result) => result.claimed === 0)) break;
      }
      expect(committed).toHaveLength(60);
      expect(committed.filter((id) => deliveries.get(id) !== 1)).toEqual([]);
      expect(deliveries.has(rolledBack)).toBe(false);
      const { rows } = await admin.query(`SELECT status, count(*)::int AS n FROM "${outbox.table}" GROUP BY status`);
      expect(rows).toEqual([{ status: 'delivered', n: 60 }]);

      // purge() through the pooler: the rows delivered long enough ago go, batch after batch.
      await admin.query(`UPDATE "${outbox.table}" SET delivered_at = now() - interval '2 days'`);
      const purged = await outbox.purge(producer, { olderThan: '1d', batchSize: 7 });
      expect(purged.deleted).toBe(60);
      expect((await admin.query(`SELECT count(*)::int AS n FROM "${outbox.table}"`)).rows[0].n).toBe(0);
    });
  }

  it('a round the pooler refuses (query_wait_timeout) loses nothing: the next round delivers', async () => {
    const busy = await startPgBouncer({
      databaseUrl,
      poolMode: 'transaction',
      poolSize: 1,
      settings: { query_wait_timeout: 1 },
    });
    const pool = new pg.Pool({ connectionString: busy.url, max: 2 });
    pool.on('error', () => undefined);
    try {
      const outbox = freshOutbox('pgb_wait');
      await outbox.migrate(admin);
      const id = `evt_${randomUUID()}`;
      await outbox.add(admin, { id, url, body: { wait: true } });
      const relay = outbox.relay({ db: pool, sender: createSender({ secret: SECRET, timeout: '5s' }) });
      // Another client of the pooler holds its one server connection in a transaction.
      const other = new pg.Client({ connectionString: busy.url });
      await other.connect();
      await other.query('BEGIN');
      await other.query('SELECT 1');
      try {
        await expect(relay.runOnce()).rejects.toMatchObject({ code: '08P01' });
      } finally {
        await other.query('ROLLBACK');
        await other.end();
      }
      expect(deliveries.has(id)).toBe(false);
      await expect
        .poll(async () => (await relay.runOnce().catch(() => undefined))?.delivered, { timeout: 10_000 })
        .toBe(1);
      expect(deliveries.get(id)).toBe(1);
    } finally {
      await pool.end();
      await busy.stop();
    }
  });
});
