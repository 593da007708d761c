// docs/errors.md, `response_not_replayable` and `store_unavailable` rows: a timeout that answers for a
// handler still running (koa-timeout mounted before idempotency()) keeps the key with 500
// response_not_replayable, but in transactional mode it rolls the transaction back and releases the
// key instead: the client gets 503 store_unavailable and its retry runs the operation once, whole.
// Express pins this in timeout-listeners.review.int.test.ts; this is the Koa half, on real PostgreSQL.
// Was wrong: Koa's held capture did not know the handler still ran, so koa-timeout's 503 ("Request
// timeout") was the transaction's outcome: the handler's writes rolled back (a 5xx), yet the 503 was
// stored and replayed to every retry for the retention, and the operation could never run under its key.
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import { idempotency } from '@idem/koa';
import { migrate, type PostgresTransaction, postgresStore } from '@idem/postgres';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import Koa, { type Middleware } from 'koa';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gate, listen, post, retryPast409, until } from '../../core/test/support/timeouts-kit.js';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the Koa transactional timeout audit',
);

// What koa-timeout does: race the rest of the chain against a timer and, when the timer wins, throw
// a 503 that Koa's error handler answers, while the handler goes on.
function koaTimeout(ms: number): Middleware {
  return async (_ctx, next) => {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => reject(Object.assign(new Error('Request timeout'), { status: 503, expose: true })), ms);
    });
    try {
      await Promise.race([next(), timedOut]);
    } finally {
      clearTimeout(timer);
    }
  };
}

describe.runIf(withPostgres)('Koa transactional on PostgreSQL: koa-timeout answers while the handler runs', () => {
  const run = randomBytes(4).toString('hex');
  const table = `idem_koa_timeout_tx_${run}`;
  const effects = `idem_koa_timeout_tx_effects_${run}`;
  let pool: pg.Pool;
  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
    pool.on('error', () => undefined);
    await migrate(pool, { table });
    await pool.query(`CREATE TABLE "${effects}" (key text, step text)`);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.query(`DROP TABLE IF EXISTS "${effects}"`);
    await pool.end();
  });

  const steps = async (key: string) =>
    (await pool.query(`SELECT step FROM "${effects}" WHERE key = $1 ORDER BY step`, [key])).rows.map(
      (row: { step: string }) => row.step,
    );

  it('the timeout rolls the transaction back and releases the key (503 store_unavailable); the retry runs it once, whole', async () => {
    const provider = gate();
    const failures: unknown[] = [];
    const app = new Koa();
    app.silent = true;
    app.use(async (ctx, next) => {
      ctx.state.auth = { sub: 'user-1', iss: 'https://issuer.test' } as never;
      await next();
    });
    app.use(koaTimeout(150));
    app.use(idempotency({ store: postgresStore({ client: pool, table }), transactional: true, storeTimeout: '15s' }));
    let first = true;
    app.use(async (ctx) => {
      const tx = ctx.state.idempotency?.tx as PostgresTransaction;
      const key = String(ctx.get('idempotency-key'));
      const waits = first;
      first = false;
      try {
        await tx.query(`INSERT INTO "${effects}" (key, step) VALUES ($1, 'debit')`, [key]);
        if (waits) await provider.promise;
        await tx.query(`INSERT INTO "${effects}" (key, step) VALUES ($1, 'credit')`, [key]);
        ctx.status = 201;
        ctx.body = { ok: true };
      } catch (error) {
        failures.push(error);
      }
    });
    const listening = await listen(http.createServer(app.callback()));
    const url = `${listening.url}/charges`;
    const key = `koa-timeout-tx-${run}`;
    try {
      const answer = await post(url, key);
      expect(answer.status).toBe(503);
      expect(JSON.parse(answer.body)).toMatchObject({ code: 'store_unavailable' });
      provider.open();
      // The first handler goes on, and its transaction refuses its next write.
      await until(() => failures.length === 1);
      expect(await steps(key)).toEqual([]);
      const retry = await retryPast409(url, key);
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(await steps(key)).toEqual(['credit', 'debit']);
      const replay = await post(url, key);
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
    } finally {
      provider.open();
      await listening.close();
    }
  });
});
