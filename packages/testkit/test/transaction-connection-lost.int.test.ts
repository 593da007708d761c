// Transactional mode on a real PostgreSQL: the connection of a handler's transaction dies while the
// handler runs (a failover, pg_terminate_backend, idle_in_transaction_session_timeout). The handler's
// next `tx.query` rejects with the store's own StoreUnavailableError, as docs/stores.md promises, and
// a handler written as the guides show (no try/catch around `tx.query`) lets it escape. Nothing
// committed: the store was unavailable, so DESIGN's table says 503 with Retry-After, and the key is
// free for the retry, as when COMMIT itself fails. (The framework's 500 was once served and, a 5xx
// being stored under the default policy, replayed for the retention, for an operation that never
// happened.)

import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import { migrate, type PostgresTransaction, postgresStore } from '@idem/postgres';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the transaction-connection-lost test',
);
const tag = randomBytes(4).toString('hex');

type Handler = (tx: PostgresTransaction, key: string) => Promise<void>;

// The options every adapter takes alike here.
interface Options {
  store: ReturnType<typeof postgresStore>;
  transactional: true;
  scope: () => string;
  onEvent: (event: IdempotencyEvent) => void;
}

interface Started {
  url: string;
  close(): Promise<void>;
}

// One transactional POST /charges per adapter, its handler as the guides write it.
const servers: Record<'express' | 'fastify' | 'koa', (options: Options, handler: Handler) => Promise<Started>> = {
  async express(options, handler) {
    const app = express();
    app.post('/charges', expressIdempotency(options), express.json(), async (req, res) => {
      await handler(req.idempotency?.tx as PostgresTransaction, req.idempotency?.key as string);
      res.status(201).json({ ok: true });
    });
    app.use(idempotencyErrors());
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    return {
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/charges`,
      close: () => new Promise((resolve) => server.close(() => resolve())),
    };
  },
  async fastify(options, handler) {
    const app = Fastify();
    await app.register(async (scope) => {
      await scope.register(fastifyIdempotency, options);
      scope.post('/charges', async (request, reply) => {
        await handler(request.idempotency?.tx as PostgresTransaction, request.idempotency?.key as string);
        return reply.code(201).send({ ok: true });
      });
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    return { url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/charges`, close: () => app.close() };
  },
  async koa(options, handler) {
    const app = new Koa();
    app.silent = true;
    const middleware = koaIdempotency(options);
    app.use((ctx, next) =>
      ctx.path === '/charges' && ctx.method === 'POST'
        ? middleware(ctx, async () => {
            await handler(ctx.state.idempotency?.tx as PostgresTransaction, ctx.state.idempotency?.key as string);
            ctx.status = 201;
            ctx.body = { ok: true };
          })
        : next(),
    );
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    return {
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/charges`,
      close: () => new Promise((resolve) => server.close(() => resolve())),
    };
  },
};

describe.runIf(withPostgres)('transactional mode: the connection of the transaction dies inside the handler', () => {
  const table = `idem_test_txlost_${tag}`;
  const effects = `${table}_effects`;
  let pool: pg.Pool;
  let admin: pg.Pool;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);

  beforeAll(async () => {
    admin = new pg.Pool({ connectionString: databaseUrl, max: 2 });
    admin.on('error', () => undefined);
    pool = new pg.Pool({ connectionString: databaseUrl, max: 4, connectionTimeoutMillis: 2000, query_timeout: 5000 });
    pool.on('error', () => undefined);
    await migrate(admin, { table });
    await admin.query(`CREATE TABLE "${effects}" (key text NOT NULL)`);
    process.on('unhandledRejection', onUnhandled);
  });

  afterAll(async () => {
    process.off('unhandledRejection', onUnhandled);
    await admin.query(`DROP TABLE IF EXISTS "${effects}"`);
    await admin.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
    await admin.end();
  });

  for (const name of ['express', 'fastify', 'koa'] as const) {
    it(`${name}: 503 with Retry-After, nothing stored, and the retry runs once`, async () => {
      const events: IdempotencyEvent[] = [];
      let runs = 0;
      const server = await servers[name](
        {
          store: postgresStore({ client: pool, table }),
          transactional: true,
          scope: () => `caller-${name}`,
          onEvent: (event: IdempotencyEvent) => events.push(event),
        },
        async (tx, key) => {
          runs++;
          const { rows } = await tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
          // The first run's connection is terminated as a failover or an operator would.
          if (runs === 1) await admin.query('SELECT pg_terminate_backend($1)', [rows[0]?.pid]);
          await tx.query(`INSERT INTO "${effects}" (key) VALUES ($1)`, [key]);
        },
      );
      const key = `lost-${name}-${tag}`;
      const send = () =>
        fetch(server.url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': key },
          body: '{"amount":100}',
        });
      try {
        const first = await send();
        const firstBody = await first.text();
        // What DESIGN's table says for a store that failed: 503, Retry-After, store_unavailable.
        expect(first.status).toBe(503);
        expect(first.headers.get('retry-after')).not.toBeNull();
        expect(JSON.parse(firstBody).code).toBe('store_unavailable');
        expect(events.filter((event) => event.type === 'complete')).toHaveLength(0);
        expect(events).toContainEqual(expect.objectContaining({ type: 'store-error', phase: 'transaction' }));
        // One store-error, carrying the store's own error (not a wrapper of it, not its cause), and the
        // key released once: no second release that finds it gone and reports the lease lost.
        const storeErrors = events.filter((event) => event.type === 'store-error');
        expect(storeErrors).toHaveLength(1);
        expect((storeErrors[0] as { error: Error }).error.name).toBe('StoreUnavailableError');
        expect(events.filter((event) => event.type === 'lease-lost')).toHaveLength(0);
        // Nothing committed, so the retry runs, once, and succeeds.
        const retry = await send();
        expect(retry.headers.get('idempotent-replayed')).toBeNull();
        expect(retry.status).toBe(201);
        expect(runs).toBe(2);
        const { rows } = await admin.query(`SELECT count(*)::int AS n FROM "${effects}" WHERE key = $1`, [key]);
        expect(rows[0].n).toBe(1);
        expect(unhandled).toEqual([]);
      } finally {
        await server.close();
      }
    });

    it(`${name}: a handler's own error inside the transaction is no store failure (the framework's 500, no 503)`, async () => {
      const events: IdempotencyEvent[] = [];
      const server = await servers[name](
        {
          store: postgresStore({ client: pool, table }),
          transactional: true,
          scope: () => `caller-own-${name}`,
          onEvent: (event: IdempotencyEvent) => events.push(event),
        },
        async (tx) => {
          await tx.query('SELECT 1');
          throw new Error('the handler failed on its own');
        },
      );
      try {
        const first = await fetch(server.url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': `own-${name}-${tag}` },
          body: '{"amount":100}',
        });
        await first.text();
        expect(first.status).toBe(500);
        expect(events.filter((event) => event.type === 'store-error')).toHaveLength(0);
      } finally {
        await server.close();
      }
    });
  }
});
