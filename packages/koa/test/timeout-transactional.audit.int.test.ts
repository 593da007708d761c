// docs/errors.md, `response_not_replayable` and `store_unavailable` rows: a timeout that answers for a
// handler still running (koa-timeout mounted before idempotency()) keeps the key with 500
// response_not_replayable, but in transactional mode it rolls the transaction back and releases the
// key instead: the client gets 503 store_unavailable and its retry runs the operation once, whole.
// Express pins this in timeout-listeners.review.int.test.ts; this is the Koa half, on real PostgreSQL.
// Was wrong: Koa's held capture did not know the handler still ran, so koa-timeout's 503 ("Request
// timeout") was the transaction's outcome: the handler's writes rolled back (a 5xx), yet the 503 was
// stored and replayed to every retry for the retention, and the operation could never run under its key.
import http from 'node:http';
import { idempotency } from '@idem/koa';
import type { PostgresTransaction } from '@idem/postgres';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { gate, listen, post, retryPast409, until } from '../../core/test/support/timeouts-kit.js';
import { postgresForTimeouts, transactionalTables } from '../../core/test/support/transactional-tables.js';
import { koaTimeout } from './support/koa-timeout.js';

const withPostgres = await postgresForTimeouts('the Koa transactional timeout audit');

describe.runIf(withPostgres)('Koa transactional on PostgreSQL: koa-timeout answers while the handler runs', () => {
  const db = transactionalTables('koa_timeout_tx');
  const { effects, run, steps } = db;

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
    app.use(idempotency({ store: db.store(), transactional: true, storeTimeout: '15s' }));
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

  // A handler that ends `ctx.res` itself inside the transaction. With `ctx.respond = false` the end is
  // its own: stored with its writes, and replayed.
  const ownEnd = (ownsResponse: boolean, thenThrows = false) => {
    const app = new Koa();
    app.silent = true;
    app.use(async (ctx, next) => {
      ctx.state.auth = { sub: 'user-1', iss: 'https://issuer.test' } as never;
      await next();
    });
    app.use(idempotency({ store: db.store(), transactional: true, storeTimeout: '15s' }));
    app.use(async (ctx) => {
      const tx = ctx.state.idempotency?.tx as PostgresTransaction;
      await tx.query(`INSERT INTO "${effects}" (key, step) VALUES ($1, 'debit')`, [String(ctx.get('idempotency-key'))]);
      if (ownsResponse) ctx.respond = false;
      ctx.res.writeHead(201, { 'content-type': 'application/json' });
      ctx.res.end('{"ok":true}');
      if (thenThrows) throw new Error('after the end');
    });
    return listen(http.createServer(app.callback()));
  };

  it('Held: a handler that ends ctx.res itself with ctx.respond = false: its 201 is stored with its writes and replayed', async () => {
    const listening = await ownEnd(true);
    const key = `koa-own-end-${run}`;
    try {
      expect((await post(`${listening.url}/charges`, key)).status).toBe(201);
      expect(await steps(key)).toEqual(['debit']);
      const replay = await post(`${listening.url}/charges`, key);
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
    } finally {
      await listening.close();
    }
  });

  // Was wrong (found in a review): without `ctx.respond = false` the end is not the handler's own (Koa
  // answers after it), and it reads as written for a running handler, so the transaction rolled back
  // (no rows) as it should; but the client got no answer at all: Koa, seeing a response not ended
  // (the end was held), wrote its own over it, a body without a head, and the connection was cut.
  // Koa does not support bypassing its response without `ctx.respond = false`; the answer is the
  // rollback's 503, the key released.
  it.each([
    ['returns', false],
    ['then throws', true],
  ] as const)(
    'a handler that ends ctx.res itself without ctx.respond = false, then %s: Koa writes nothing over it; rolled back, 503 store_unavailable',
    async (name, thenThrows) => {
      const listening = await ownEnd(false, thenThrows);
      const key = `koa-bypass-end-${name.replace(' ', '-')}-${run}`;
      try {
        const answer = await post(`${listening.url}/charges`, key);
        expect(await steps(key)).toEqual([]);
        expect(answer.status).toBe(503);
        expect(JSON.parse(answer.body)).toMatchObject({ code: 'store_unavailable' });
      } finally {
        await listening.close();
      }
    },
  );
});
