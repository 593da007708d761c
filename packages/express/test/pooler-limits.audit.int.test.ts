// Audit (branch audit-pgbouncer): the server-side limits of a production PostgreSQL, reached through
// PgBouncer in transaction mode (and one without it), answered over real HTTP. DESIGN's table says
// a store that cannot serve is a 503 with Retry-After, never a 500 or a hang, and problem bodies
// carry no infrastructure detail: pg's error texts name roles, hosts, settings and the pooler.
// Each limit is set on a role of its own (ALTER ROLE ... SET, the way a managed database or a DBA
// sets it; PgBouncer refuses pg's `options`), so nothing here touches another test's sessions.
import { randomBytes, randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { idempotency, idempotencyErrors } from '@idem/express';
import { migrate, type PostgresTransaction, postgresStore } from '@idem/postgres';
import { databaseUrl, postgresAnswers, serviceAvailable } from '@idem/testkit';
import express from 'express';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type PgBouncer, pgBouncerAvailable, startPgBouncer } from '../../testkit/test/audit-support/pgbouncer.js';

const available =
  serviceAvailable(`PostgreSQL at ${databaseUrl()}`, await postgresAnswers(databaseUrl()), 'the pooler limit audits') &&
  pgBouncerAvailable('the pooler limit audits');

const suffix = randomBytes(4).toString('hex');
const table = `idem_audit_pgb_limits_${suffix}`;
const effects = `${table}_effects`;
const roles = {
  // statement_timeout, as managed databases set it on the application role.
  slow: `idem_audit_pgb_slow_${suffix}`,
  // idle_in_transaction_session_timeout: a transactional handler that awaits something else.
  idle: `idem_audit_pgb_idle_${suffix}`,
  // CONNECTION LIMIT 1: the server's "too many connections" (53300) for this role alone.
  few: `idem_audit_pgb_few_${suffix}`,
  // idle_session_timeout (PostgreSQL 14+): the server ends the pool's idle connections.
  idleSession: `idem_audit_pgb_idles_${suffix}`,
} as const;

// Words of pg's and PgBouncer's error texts, and the connection details they carry.
const leaks = [
  'canceling',
  'statement timeout',
  'idle-in-transaction',
  'terminating',
  'too many',
  'query_wait_timeout',
  'pgbouncer',
  'PostgreSQL',
  '127.0.0.1',
  'idem_audit_pgb',
  'pg_sleep',
];

const urlAs = (url: string, role: string) => {
  const parsed = new URL(url);
  parsed.username = role;
  return parsed.toString();
};

interface Answer {
  status: number;
  headers: Headers;
  text: string;
}

describe.runIf(available)('server-side limits behind PgBouncer, over HTTP', () => {
  const admin = new pg.Pool({ connectionString: databaseUrl(), max: 3 });
  admin.on('error', () => undefined);
  const pools: pg.Pool[] = [];
  const closers: (() => Promise<void>)[] = [];
  let bouncer: PgBouncer;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);

  const poolFor = (url: string, config: pg.PoolConfig = {}) => {
    const pool = new pg.Pool({ connectionString: url, max: 4, ...config });
    pool.on('error', () => undefined);
    pools.push(pool);
    return pool;
  };

  // One idempotent route. What the handler does comes from `x-mode`: `write` inserts the effect and
  // answers 201; `sleep` runs a statement longer than the role's statement_timeout; `idle` writes,
  // then waits (on other work) until the server has ended its session for idling in the transaction.
  const serve = async (pool: pg.Pool, transactional: boolean): Promise<string> => {
    const app = express();
    app.post(
      '/charges',
      idempotency({
        store: postgresStore({ client: pool, table, preparedStatements: false }),
        scope: () => 'caller',
        transactional,
        storeTimeout: '8s',
      }),
      async (req, res) => {
        const key = String(req.headers['idempotency-key']).replaceAll('"', '');
        const run = async (text: string, params: unknown[] = []) =>
          transactional
            ? (req.idempotency as { tx: PostgresTransaction }).tx.query(text, params)
            : pool.query(text, params as unknown[]);
        const mode = req.headers['x-mode'];
        if (mode === 'sleep') await run('SELECT pg_sleep(3)');
        await run(`INSERT INTO "${effects}" (key) VALUES ($1)`, [key]);
        if (mode === 'idle') {
          const { rows } = await run('SELECT pg_backend_pid() AS pid');
          const pid = (rows[0] as { pid: number }).pid;
          // Other work (a partner's API, say) outlasts idle_in_transaction_session_timeout: watched
          // on the server rather than slept through, so a slow machine cannot make it pass early.
          await expect
            .poll(
              async () =>
                (await admin.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = $1', [pid])).rows[0].n,
              { timeout: 10_000, interval: 50 },
            )
            .toBe(0);
        }
        res.status(201).json({ key });
      },
    );
    // As docs/guides/express.md says: first among the error handlers, so that a handler's failed
    // `tx.query` is known as the store's failure.
    app.use(idempotencyErrors());
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    closers.push(async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    });
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}/charges`;
  };

  const post = async (url: string, key: string, mode = 'write'): Promise<Answer> => {
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'idempotency-key': `"${key}"`, 'content-type': 'application/json', 'x-mode': mode },
      body: '{"amount":100}',
      signal: AbortSignal.timeout(20_000),
    });
    return { status: response.status, headers: response.headers, text: await response.text() };
  };

  const effectsOf = async (key: string) =>
    (await admin.query(`SELECT count(*)::int AS n FROM "${effects}" WHERE key = $1`, [key])).rows[0].n as number;

  // The documented answer: 503 store_unavailable with Retry-After, and none of the database's words.
  const expectUnavailable = (answer: Answer) => {
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^\d+$/);
    expect(answer.headers.get('content-type')).toMatch(/application\/problem\+json/);
    expect(JSON.parse(answer.text)).toMatchObject({ code: 'store_unavailable', retryable: true });
    for (const word of leaks) expect(answer.text.toLowerCase()).not.toContain(word.toLowerCase());
  };

  beforeAll(async () => {
    process.on('unhandledRejection', onUnhandled);
    await migrate(admin, { table });
    await admin.query(`CREATE TABLE "${effects}" (key text NOT NULL)`);
    await admin.query(`DROP ROLE IF EXISTS ${Object.values(roles).join(', ')}`);
    await admin.query(`CREATE ROLE ${roles.slow} LOGIN`);
    await admin.query(`ALTER ROLE ${roles.slow} SET statement_timeout = '300ms'`);
    await admin.query(`CREATE ROLE ${roles.idle} LOGIN`);
    await admin.query(`ALTER ROLE ${roles.idle} SET idle_in_transaction_session_timeout = '300ms'`);
    await admin.query(`CREATE ROLE ${roles.few} LOGIN CONNECTION LIMIT 1`);
    await admin.query(`CREATE ROLE ${roles.idleSession} LOGIN`);
    await admin.query(`ALTER ROLE ${roles.idleSession} SET idle_session_timeout = '300ms'`);
    for (const role of Object.values(roles)) {
      await admin.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON "${table}", "${effects}" TO ${role}`);
    }
    bouncer = await startPgBouncer({
      databaseUrl: databaseUrl(),
      poolMode: 'transaction',
      poolSize: 3,
      users: Object.values(roles),
      // Far below its default of 120 s, and below the engine's storeTimeout: the pooler answers first.
      settings: { query_wait_timeout: 1 },
    });
  });

  afterAll(async () => {
    process.off('unhandledRejection', onUnhandled);
    for (const close of closers.splice(0)) await close();
    for (const pool of pools.splice(0)) await pool.end();
    await bouncer?.stop();
    await admin.query(`DROP TABLE IF EXISTS "${effects}", "${table}"`);
    await admin.query(`DROP ROLE IF EXISTS ${Object.values(roles).join(', ')}`);
    await admin.end();
  });

  it('statement_timeout in a transactional handler: 503 with Retry-After, the write rolled back, the key free for the retry', async () => {
    const url = await serve(poolFor(urlAs(bouncer.url, roles.slow)), true);
    const key = randomUUID();
    expectUnavailable(await post(url, key, 'sleep'));
    expect(await effectsOf(key)).toBe(0);
    const retry = await post(url, key);
    expect(retry.status).toBe(201);
    expect(await effectsOf(key)).toBe(1);
    expect(unhandled).toEqual([]);
  });

  it('statement_timeout on a claim waiting for a row lock: 503 with Retry-After, then the retry runs', async () => {
    const url = await serve(poolFor(urlAs(bouncer.url, roles.slow)), false);
    const key = randomUUID();
    expect((await post(url, key)).status).toBe(201);
    // The record's retention ends (as time passing would), and a session holds its row: a claim that
    // would take it over waits for the lock, and the role's statement_timeout ends the wait.
    await admin.query(`UPDATE "${table}" SET expires_at = clock_timestamp() - interval '1 second'`);
    const holder = await admin.connect();
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT 1 FROM "${table}" FOR UPDATE`);
      expectUnavailable(await post(url, key));
    } finally {
      await holder.query('ROLLBACK');
      holder.release();
    }
    expect(await effectsOf(key)).toBe(1);
    expect((await post(url, key)).status).toBe(201);
    expect(await effectsOf(key)).toBe(2);
  });

  it('idle_in_transaction_session_timeout ends a transactional handler session: 503, nothing committed, no crash', async () => {
    const url = await serve(poolFor(urlAs(bouncer.url, roles.idle)), true);
    const key = randomUUID();
    expectUnavailable(await post(url, key, 'idle'));
    expect(await effectsOf(key)).toBe(0);
    const retry = await post(url, key);
    expect(retry.status).toBe(201);
    expect(await effectsOf(key)).toBe(1);
    expect(unhandled).toEqual([]);
  });

  for (const through of ['PgBouncer', 'no pooler'] as const) {
    it(`idle_session_timeout ends the pool's idle connections (${through}): the next requests are served`, async () => {
      const target = through === 'PgBouncer' ? bouncer.url : databaseUrl();
      const pool = poolFor(urlAs(target, roles.idleSession));
      const url = await serve(pool, false);
      expect((await post(url, randomUUID())).status).toBe(201);
      // Until the server has ended every session of the role (the pooler's, or the pool's own).
      await expect
        .poll(
          async () =>
            (
              await admin.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1', [
                roles.idleSession,
              ])
            ).rows[0].n,
          { timeout: 10_000, interval: 50 },
        )
        .toBe(0);
      // pg hears of it on each idle connection and drops it (the pool's 'error' listener is there).
      if (through === 'no pooler') await expect.poll(() => pool.totalCount, { timeout: 10_000 }).toBe(0);
      for (let i = 0; i < 3; i++) expect((await post(url, randomUUID())).status).toBe(201);
      expect(unhandled).toEqual([]);
    });
  }

  it('too many connections (53300) without a pooler: 503 with Retry-After, quickly', async () => {
    const direct = urlAs(databaseUrl(), roles.few);
    // The role's one connection is taken: the pool's first connect is refused by the server.
    const hog = new pg.Client({ connectionString: direct });
    await hog.connect();
    try {
      const url = await serve(poolFor(direct, { connectionTimeoutMillis: 5_000 }), false);
      const key = randomUUID();
      expectUnavailable(await post(url, key));
      expect(await effectsOf(key)).toBe(0);
    } finally {
      await hog.end();
    }
  });

  it('too many connections behind PgBouncer (its logins to the server fail): 503 with Retry-After, no hang', async () => {
    const hog = new pg.Client({ connectionString: urlAs(databaseUrl(), roles.few) });
    await hog.connect();
    try {
      const url = await serve(poolFor(urlAs(bouncer.url, roles.few)), false);
      const key = randomUUID();
      expectUnavailable(await post(url, key));
      expect(await effectsOf(key)).toBe(0);
    } finally {
      await hog.end();
    }
  });

  it("the pooler's own client limit (max_client_conn): 503 with Retry-After", async () => {
    const full = await startPgBouncer({
      databaseUrl: databaseUrl(),
      poolMode: 'transaction',
      poolSize: 2,
      settings: { max_client_conn: 1 },
    });
    // The probe that saw the pooler start may still count as its client for a moment.
    let hog = new pg.Client({ connectionString: full.url });
    await expect
      .poll(async () => {
        hog = new pg.Client({ connectionString: full.url });
        hog.on('error', () => undefined);
        return hog.connect().then(
          () => true,
          () => false,
        );
      })
      .toBe(true);
    try {
      const url = await serve(poolFor(full.url), false);
      const key = randomUUID();
      expectUnavailable(await post(url, key));
      expect(await effectsOf(key)).toBe(0);
    } finally {
      await hog.end();
      await full.stop();
    }
    expect(unhandled).toEqual([]);
  });

  it('a pooler whose server connections are all busy: 503 at query_wait_timeout, then service resumes', async () => {
    const busy = await startPgBouncer({
      databaseUrl: databaseUrl(),
      poolMode: 'transaction',
      poolSize: 1,
      settings: { query_wait_timeout: 1 },
    });
    try {
      const pool = poolFor(busy.url);
      const url = await serve(pool, true);
      // Another client of the pooler holds the one server connection in a transaction.
      const other = new pg.Client({ connectionString: busy.url });
      await other.connect();
      await other.query('BEGIN');
      await other.query('SELECT 1');
      const key = randomUUID();
      try {
        expectUnavailable(await post(url, key));
      } finally {
        await other.query('ROLLBACK');
        await other.end();
      }
      expect(await effectsOf(key)).toBe(0);
      await expect.poll(async () => (await post(url, key)).status, { timeout: 10_000 }).toBe(201);
      expect(await effectsOf(key)).toBe(1);
    } finally {
      await busy.stop();
    }
    expect(unhandled).toEqual([]);
  });
});
