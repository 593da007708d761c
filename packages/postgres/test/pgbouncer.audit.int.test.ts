// Audit (branch audit-pgbouncer): @idem/postgres behind a real PgBouncer, in transaction pooling
// (each transaction may run on another server session: nothing of a session survives from one
// statement to the next) and in session pooling, with a small server pool (2) and more clients than
// it has connections. What the store relies on, checked here: every statement is its own
// transaction or inside the caller's BEGIN ... COMMIT; migrate() takes a transaction-scoped advisory
// lock and a SET LOCAL lock_timeout; no LISTEN, temp table or session SET anywhere.
import { randomUUID } from 'node:crypto';
import { createIdempotency } from '@idem/core';
import { describeStore } from '@idem/testkit';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type PgBouncer, pgBouncerAvailable, startPgBouncer } from '../../testkit/test/audit-support/pgbouncer.js';
import { migrate, postgresStore } from '../src/index.js';
import { contenderReport, startContender } from './contenders.js';
import { databaseUrl, freshTable, harness, postgresAvailable, sql, testPool, uniqueTable } from './database.js';

const available = (await postgresAvailable()) && pgBouncerAvailable('the PgBouncer audits of @idem/postgres');
const body = (text: string) => ({ status: 201, headers: {}, body: new TextEncoder().encode(text) });

const bouncerPool = (bouncer: PgBouncer, config: pg.PoolConfig = {}) => {
  const pool = new pg.Pool({ connectionString: bouncer.url, max: 8, ...config });
  pool.on('error', () => undefined);
  return pool;
};

// In session mode a pg connection keeps its server session for as long as it is open: a Pool larger
// than the server pool would wait for a session (up to query_wait_timeout), so it is sized to it.
const poolMax = { transaction: 8, session: 4 } as const;

// What both pool modes must do alike: transactional mode, migrate() from several pools, purging.
function sharedCases(mode: keyof typeof poolMax, bouncerOf: () => PgBouncer, admin: pg.Pool) {
  it('transactional mode: more handlers than server connections all commit, each with its own writes', async () => {
    const pool = bouncerPool(bouncerOf(), { max: poolMax[mode] });
    const { table, drop } = await freshTable(admin, `pgb_txmode_${mode}`);
    const effects = `${table}_effects`;
    await sql(admin, `CREATE TABLE "${effects}" (key text PRIMARY KEY, backend integer NOT NULL)`);
    try {
      const engine = createIdempotency({ store: postgresStore({ client: pool, table, preparedStatements: false }) });
      const keys = Array.from({ length: 8 }, () => randomUUID());
      const results = await Promise.all(
        keys.map(async (key) => {
          const started = await engine.begin({ key, scope: 'u', operation: 'POST /orders', fingerprint: 'f' });
          if (started.kind !== 'execute') throw new Error(`a fresh key executes, not ${started.kind}`);
          return engine.transaction(started.lease, async (tx: pg.PoolClient) => {
            // Two statements of one transaction: the pooler keeps them on one server session.
            const { rows } = await tx.query('SELECT pg_backend_pid() AS pid');
            await tx.query(`INSERT INTO "${effects}" (key, backend) VALUES ($1, $2)`, [key, rows[0].pid]);
            await tx
              .query(`UPDATE "${effects}" SET backend = backend WHERE key = $1 AND backend = pg_backend_pid()`, [key])
              .then((result) => {
                if (result.rowCount !== 1) throw new Error('the transaction moved to another server session');
              });
            return { value: key, response: body(key) };
          });
        }),
      );
      expect(results.every((result) => result.committed)).toBe(true);
      expect((await sql(admin, `SELECT count(*)::int AS n FROM "${effects}"`))[0].n).toBe(8);
      const states = await sql(admin, `SELECT state FROM "${table}"`);
      expect(states.map((row) => row.state)).toEqual(Array(8).fill('completed'));
    } finally {
      await pool.end();
      await sql(admin, `DROP TABLE IF EXISTS "${effects}"`);
      await drop();
    }
  });

  it('migrate() from four pools at once, on a new table and on one made before lease_until; its lock_timeout stays in its transaction', async () => {
    const pools = Array.from({ length: 4 }, () => bouncerPool(bouncerOf(), { max: mode === 'session' ? 1 : 2 }));
    const fresh = uniqueTable('pgb_migrate');
    const old = uniqueTable('pgb_migrate_old');
    await sql(
      admin,
      `CREATE TABLE "${old}" (id text PRIMARY KEY, state text NOT NULL, token text NOT NULL, fingerprint text NOT NULL,
         status integer, headers jsonb, body bytea, expires_at timestamptz NOT NULL)`,
    );
    try {
      await Promise.all(pools.flatMap((pool) => [migrate(pool, { table: fresh }), migrate(pool, { table: old })]));
      const columns = await sql(
        admin,
        `SELECT count(*)::int AS n FROM information_schema.columns WHERE table_name = $1 AND column_name = 'lease_until'`,
        [old],
      );
      expect(columns[0].n).toBe(1);
      // migrate() set lock_timeout for the ALTER: a session SET would stay on the server session the
      // pooler hands the next client. Every server session of the pool still has the default.
      const seen = await Promise.all(
        Array.from({ length: 6 }, async () => {
          const client = await pools[0]?.connect();
          if (!client) throw new Error('no client');
          try {
            await client.query('BEGIN');
            const { rows } = await client.query(`SELECT current_setting('lock_timeout') AS value`);
            await client.query('COMMIT');
            return rows[0].value as string;
          } finally {
            client.release();
          }
        }),
      );
      expect(new Set(seen)).toEqual(new Set(['0']));
    } finally {
      for (const pool of pools) await pool.end();
      await sql(admin, `DROP TABLE IF EXISTS "${fresh}", "${old}"`);
    }
  });

  it('purgeExpired() deletes what expired while claims run through the same pooler', async () => {
    const pool = bouncerPool(bouncerOf(), { max: poolMax[mode] });
    const { table, drop } = await freshTable(admin, `pgb_purge_${mode}`);
    try {
      const store = postgresStore({ client: pool, table, preparedStatements: false });
      for (let i = 0; i < 30; i++) {
        await store.claim({ id: `old-${i}`, token: 't', fingerprint: 'f', leaseMs: 60_000 });
        await store.complete({ id: `old-${i}`, token: 't', response: body('x'), retentionMs: 60_000 });
      }
      await sql(admin, `UPDATE "${table}" SET expires_at = clock_timestamp() - interval '1 second'`);
      const claims = Promise.all(
        Array.from({ length: 30 }, () =>
          store.claim({ id: randomUUID(), token: 't', fingerprint: 'f', leaseMs: 60_000 }),
        ),
      );
      let deleted = 0;
      for (
        let batch = await store.purgeExpired({ batchSize: 7 });
        ;
        batch = await store.purgeExpired({ batchSize: 7 })
      ) {
        deleted += batch;
        if (batch < 7) break;
      }
      expect((await claims).every((result) => result.claimed)).toBe(true);
      expect(deleted).toBe(30);
      expect((await sql(admin, `SELECT count(*)::int AS n FROM "${table}"`))[0].n).toBe(30);
    } finally {
      await pool.end();
      await drop();
    }
  });
}

describe.runIf(available)('@idem/postgres behind PgBouncer in transaction mode', () => {
  let bouncer: PgBouncer;
  const admin = testPool({ max: 2 });

  beforeAll(async () => {
    bouncer = await startPgBouncer({ databaseUrl, poolMode: 'transaction', poolSize: 2 });
  });

  afterAll(async () => {
    await bouncer?.stop();
    await admin.end();
  });

  describeStore('postgresStore through PgBouncer (transaction mode), preparedStatements: false', async () => {
    const pool = bouncerPool(bouncer);
    const { table, drop } = await freshTable(pool, 'pgb_tx');
    const store = postgresStore({ client: pool, table, preparedStatements: false });
    return harness(pool, store, async () => {
      await drop();
      await pool.end();
    });
  });

  // Was wrong: with the default options (named prepared statements) behind PgBouncer before 1.21,
  // pg prepares each statement once per client connection, but the pooler runs the next transaction
  // on another server session, which lacks it (26000) or has it already from another client (42P05).
  // About half of 60 parallel claims through 6 clients and 2 server sessions failed, each a 503 (the
  // error named the option to turn off, but a default that fails half the requests behind the most
  // common production pooler is no default). Such a statement failed at Parse or Bind, before it
  // ran, so the store now sends it again unnamed, and from then on sends every statement unnamed.
  it('default options: every claim goes through, and the store stops preparing statements', async () => {
    const pool = bouncerPool(bouncer, { max: 6 });
    const { table, drop } = await freshTable(admin, 'pgb_prepared');
    try {
      const store = postgresStore({ client: pool, table });
      for (let round = 0; round < 3; round++) {
        const results = await Promise.allSettled(
          Array.from({ length: 60 }, () =>
            store.claim({ id: randomUUID(), token: 't', fingerprint: 'f', leaseMs: 60_000 }),
          ),
        );
        const failures = results.filter((result) => result.status === 'rejected');
        expect(failures.map((failure) => (failure.reason as { code?: string }).code)).toEqual([]);
      }
      expect((await sql(admin, `SELECT count(*)::int AS n FROM "${table}"`))[0].n).toBe(180);
    } finally {
      await pool.end();
      await drop();
    }
  });

  sharedCases('transaction', () => bouncer, admin);
});

describe.runIf(available)('a claim that waits in the pooler past storeTimeout', () => {
  let bouncer: PgBouncer;
  const admin = testPool({ max: 2 });

  beforeAll(async () => {
    // One server connection, and the pooler's default patience (120 s): the claim waits there.
    bouncer = await startPgBouncer({ databaseUrl, poolMode: 'transaction', poolSize: 1 });
  });

  afterAll(async () => {
    await bouncer?.stop();
    await admin.end();
  });

  // The engine answers 503 at storeTimeout, but pg cannot take back a query the pooler holds: the
  // claim lands once a server connection is free, with nobody to run its handler. The engine
  // withdraws such a late claim, so the retry runs (once) without waiting out a lease.
  it('503 at storeTimeout; the claim that lands later is withdrawn, and the retry runs once', async () => {
    const pool = bouncerPool(bouncer, { max: 2 });
    const { table, drop } = await freshTable(admin, 'pgb_late');
    const store = postgresStore({ client: pool, table, preparedStatements: false });
    const engine = createIdempotency({ store, storeTimeout: '300ms', lease: '30s' });
    const request = { key: randomUUID(), scope: 'u', operation: 'POST /orders', fingerprint: 'f' };
    const other = new pg.Client({ connectionString: bouncer.url });
    await other.connect();
    try {
      await other.query('BEGIN');
      await other.query('SELECT 1');
      const first = await engine.begin(request);
      expect(first).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable' } });
      await other.query('ROLLBACK');
      // Until the late claim is withdrawn a retry may see it in progress (409); within far less
      // than its 30 s lease, it runs.
      const kinds: string[] = [];
      let retry = await engine.begin(request);
      for (const deadline = Date.now() + 10_000; retry.kind === 'reject' && Date.now() < deadline; ) {
        kinds.push(retry.error.code);
        await new Promise((resolve) => setTimeout(resolve, 50));
        retry = await engine.begin(request);
      }
      expect(kinds.filter((code) => code !== 'in_progress')).toEqual([]);
      expect(retry.kind).toBe('execute');
      if (retry.kind !== 'execute') return;
      expect(await engine.complete(retry.lease, body('done'))).toMatchObject({ ok: true });
      expect(await engine.begin(request)).toMatchObject({ kind: 'replay' });
      expect(await sql(admin, `SELECT state FROM "${table}"`)).toEqual([{ state: 'completed' }]);
    } finally {
      await other.end();
      await pool.end();
      await drop();
    }
  });
});

describe.runIf(available)('a completion the pooler refuses (query_wait_timeout)', () => {
  let bouncer: PgBouncer;
  const admin = testPool({ max: 2 });

  beforeAll(async () => {
    bouncer = await startPgBouncer({
      databaseUrl,
      poolMode: 'transaction',
      poolSize: 1,
      settings: { query_wait_timeout: 1 },
    });
  });

  afterAll(async () => {
    await bouncer?.stop();
    await admin.end();
  });

  // The handler ran; its outcome must not be lost because the pooler had no server connection for
  // the completion: a retry is held (409) until the outcome is stored, then replayed, never run again.
  it('the outcome is kept: retries are held, then replayed, and the handler never runs twice', async () => {
    const pool = bouncerPool(bouncer, { max: 2 });
    const { table, drop } = await freshTable(admin, 'pgb_complete');
    const engine = createIdempotency({
      store: postgresStore({ client: pool, table, preparedStatements: false }),
      storeTimeout: '5s',
      lease: '30s',
    });
    const request = { key: randomUUID(), scope: 'u', operation: 'POST /orders', fingerprint: 'f' };
    const other = new pg.Client({ connectionString: bouncer.url });
    await other.connect();
    try {
      const started = await engine.begin(request);
      if (started.kind !== 'execute') throw new Error('a fresh key executes');
      // The handler's effect happens here; then the pooler's one server connection is busy.
      await other.query('BEGIN');
      await other.query('SELECT 1');
      const completing = engine.complete(started.lease, body('first'));
      // The completion's statement waits in the pooler, until query_wait_timeout refuses it.
      const waiting = async () =>
        (await bouncer.admin('SHOW POOLS'))
          .filter((row) => row.database !== 'pgbouncer')
          .reduce((sum, row) => sum + Number(row.cl_waiting), 0);
      await expect.poll(waiting, { timeout: 10_000, interval: 20 }).toBe(1);
      await expect.poll(waiting, { timeout: 10_000, interval: 20 }).toBe(0);
      await other.query('ROLLBACK');
      await completing;
      const kinds: string[] = [];
      let retry = await engine.begin(request);
      for (const deadline = Date.now() + 15_000; retry.kind !== 'replay' && Date.now() < deadline; ) {
        kinds.push(retry.kind === 'reject' ? retry.error.code : retry.kind);
        if (retry.kind === 'execute') break;
        await new Promise((resolve) => setTimeout(resolve, 100));
        retry = await engine.begin(request);
      }
      expect(kinds.filter((kind) => kind !== 'in_progress')).toEqual([]);
      expect(retry.kind).toBe('replay');
    } finally {
      await other.end();
      await pool.end();
      await drop();
    }
  });
});

describe.runIf(available)('@idem/postgres behind PgBouncer in session mode', () => {
  let bouncer: PgBouncer;
  const admin = testPool({ max: 2 });

  beforeAll(async () => {
    bouncer = await startPgBouncer({ databaseUrl, poolMode: 'session', poolSize: 4 });
  });

  afterAll(async () => {
    await bouncer?.stop();
    await admin.end();
  });

  sharedCases('session', () => bouncer, admin);

  describeStore('postgresStore through PgBouncer (session mode), default options', async () => {
    const pool = bouncerPool(bouncer, { max: 4 });
    const { table, drop } = await freshTable(pool, 'pgb_session');
    const store = postgresStore({ client: pool, table });
    return harness(pool, store, async () => {
      await drop();
      await pool.end();
    });
  });
});

describe.runIf(available)('three processes through one PgBouncer (transaction mode, 2 server connections)', () => {
  let bouncer: PgBouncer;
  const admin = testPool({ max: 2 });
  let table: string;
  let drop: () => Promise<void>;
  let effects: string;

  beforeAll(async () => {
    bouncer = await startPgBouncer({ databaseUrl, poolMode: 'transaction', poolSize: 2 });
    ({ table, drop } = await freshTable(admin, 'pgb_multi'));
    effects = `${table}_effects`;
    await sql(admin, `CREATE TABLE "${effects}" (key text NOT NULL, pid integer NOT NULL)`);
  });

  afterAll(async () => {
    await bouncer?.stop();
    await sql(admin, `DROP TABLE IF EXISTS "${effects}"`);
    await drop?.();
    await admin.end();
  });

  for (const transactional of [false, true]) {
    it(`30 concurrent requests a process, one key, ${transactional ? 'transactional mode' : 'claim then complete'}: one execution`, async () => {
      const key = randomUUID();
      const config = {
        url: bouncer.url,
        table,
        effects,
        key,
        concurrency: 30,
        transactional,
        preparedStatements: false,
      };
      const children = await Promise.all(Array.from({ length: 3 }, () => startContender(config)));
      const reports = children.map(contenderReport);
      for (const child of children) child.send('go');
      const outcomes = (await Promise.all(reports)).flatMap((report) => report.outcomes);
      const tally: Record<string, number> = {};
      for (const outcome of outcomes) tally[outcome] = (tally[outcome] ?? 0) + 1;
      expect(Object.keys(tally).filter((k) => !['execute', 'in_progress', 'replay'].includes(k))).toEqual([]);
      expect(tally.execute).toBe(1);
      expect(await sql(admin, `SELECT pid FROM "${effects}" WHERE key = $1`, [key])).toHaveLength(1);
    }, 60_000);
  }
});
