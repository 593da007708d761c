// Adversarial review of `lease_lost` (a lost lease aborts the signal with an IdempotencyError that
// the adapters answer 503 + Retry-After): whose lease the error speaks for, and what is stored.
// Real Redis and PostgreSQL, real sockets; the lease is lost by taking the record away (the next
// renewal is refused) or by maxExecution, and the tests wait for the signal, not for a TTL.
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import express from 'express';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import Koa from 'koa';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { deleteKeys, redisAvailable, redisUrl } from '../../redis/test/redis-env.js';
import { postgresAnswers } from '../src/index.js';

const withRedis = await redisAvailable();
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const withPostgres = await postgresAnswers(databaseUrl);

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

const post = (port: number, path: string, key: string): Promise<Answer> =>
  new Promise((resolve, reject) => {
    const headers = { 'idempotency-key': key, 'content-type': 'application/json', 'content-length': '2' };
    const req = httpRequest({ host: '127.0.0.1', port, path, method: 'POST', agent: false, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        body += chunk;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end('{}');
  });

const whenAborted = (signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener('abort', () => resolve(), { once: true });
  });

type Handler = (signal: AbortSignal) => Promise<void>;

/** One server of `framework` with `/a` and `/b` running `handlers`, idempotent with `options`. */
async function serve(framework: 'express' | 'fastify' | 'koa', options: object, handlers: Record<'a' | 'b', Handler>) {
  if (framework === 'fastify') {
    const app = Fastify();
    await app.register(fastifyIdempotency, options as never);
    for (const name of ['a', 'b'] as const) {
      app.post(`/${name}`, { config: { idempotency: {} } }, async (request) => {
        await handlers[name]((request as unknown as { idempotency: { signal: AbortSignal } }).idempotency.signal);
        return { done: true };
      });
    }
    await app.listen({ port: 0, host: '127.0.0.1' });
    return { port: (app.server.address() as AddressInfo).port, close: () => app.close() };
  }
  let server: import('node:http').Server;
  if (framework === 'express') {
    const app = express();
    app.use(expressIdempotency(options as never));
    for (const name of ['a', 'b'] as const) {
      app.post(`/${name}`, (req, res, next) => {
        handlers[name]((req.idempotency as { signal: AbortSignal }).signal).then(() => res.json({ done: true }), next);
      });
    }
    app.use(idempotencyErrors());
    server = app.listen(0, '127.0.0.1');
  } else {
    const app = new Koa();
    app.use(koaIdempotency(options as never));
    app.use(async (ctx) => {
      await handlers[ctx.path === '/a' ? 'a' : 'b']((ctx.state.idempotency as { signal: AbortSignal }).signal);
      ctx.body = { done: true };
    });
    server = app.listen(0, '127.0.0.1');
  }
  await once(server, 'listening');
  return {
    port: (server.address() as AddressInfo).port,
    close: async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

describe.runIf(withRedis)('a lease_lost error that is not this execution’s (Redis)', () => {
  const prefix = `audit-review2:lease-lost:${randomBytes(4).toString('hex')}:`;
  const client = new Redis(redisUrl);
  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  for (const framework of ['express', 'fastify', 'koa'] as const) {
    // Was wrong: the adapters answered any error whose code is `lease_lost` as this execution's lost
    // lease. A handler that rethrows another request's reason (a single-flight cache: B awaits the
    // call A started with A's signal, and A lost its lease) was answered "503 lease_lost, retry with
    // the same key" while B still held its key, and that 503 was stored as B's outcome: every retry
    // replayed it. Decided: the adapters answer only their own lease's reason (`isLeaseLost(error,
    // context)`); another's is B's own failure, answered by the framework as any error a handler
    // throws (from the error's `status`) and settled by the policy as such, its retry not run again.
    it(`${framework}: B rethrowing A's lease_lost is never stored as B's outcome telling it to retry`, async () => {
      const events: IdempotencyEvent[] = [];
      const scoped = `${prefix}${framework}:`;
      let foreign: unknown;
      let aLost!: () => void;
      const aLostOnce = new Promise<void>((resolve) => {
        aLost = resolve;
      });
      let runsB = 0;
      const server = await serve(
        framework,
        {
          store: redisStore({ client, prefix: scoped }),
          scope: () => 't',
          lease: '300ms',
          onEvent: (e: IdempotencyEvent) => events.push(e),
        },
        {
          a: async (signal) => {
            await whenAborted(signal);
            foreign = signal.reason;
            aLost();
            signal.throwIfAborted();
          },
          b: async () => {
            runsB++;
            await aLostOnce;
            throw foreign;
          },
        },
      );
      try {
        const sendingA = post(server.port, '/a', 'a-1');
        await expect.poll(() => events.some((event) => event.type === 'claim'), { timeout: 5_000 }).toBe(true);
        // A's record goes (as if taken over and gone): A's next renewal is refused, its lease lost.
        await deleteKeys(client, scoped);
        const sendingB = post(server.port, '/b', 'b-1');
        const a = await sendingA;
        expect(a.status).toBe(503);
        const b = await sendingB;
        const retry = await post(server.port, '/b', 'b-1');
        expect(runsB).toBe(1);
        // B held its key throughout: its answer is its own failure as the framework answers what a
        // handler throws, never the lost-lease problem that tells the client to retry.
        const problem = b.headers['content-type']?.includes('application/problem+json') ? JSON.parse(b.body) : {};
        expect(problem.code).not.toBe('lease_lost');
        expect(retry.headers['content-type'] ?? '').not.toContain('application/problem+json');
      } finally {
        await server.close();
      }
    }, 20_000);
  }
});

describe.runIf(withPostgres)(
  'a handler stopping on its lease lost to maxExecution, transactional mode (PostgreSQL)',
  () => {
    const table = `audit_review2_lease_${randomBytes(4).toString('hex')}`;
    const pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
    afterAll(async () => {
      await pool.query(`DROP TABLE IF EXISTS "${table}"`);
      await pool.query(`DROP TABLE IF EXISTS "${table}_effects"`);
      await pool.end();
    });

    // Held: the lease lost to maxExecution while the store still has the record under this token, so
    // the commit's compare-and-set would pass; the 503 rolls the handler's writes back and is not
    // stored, and the retry runs the operation again.
    it('express: 503 lease_lost, the writes rolled back, nothing stored; the retry runs again', async () => {
      await migrate(pool, { table });
      await pool.query(`CREATE TABLE "${table}_effects" (n int)`);
      const events: IdempotencyEvent[] = [];
      let runs = 0;
      const app = express();
      app.use(
        expressIdempotency({
          store: postgresStore({ client: pool, table }),
          transactional: true,
          scope: () => 't',
          lease: '1s',
          maxExecution: '200ms',
          onEvent: (event) => events.push(event),
        }),
      );
      app.post('/charges', async (req, _res, next) => {
        runs++;
        try {
          const context = req.idempotency as { tx: pg.ClientBase; signal: AbortSignal };
          await context.tx.query(`INSERT INTO "${table}_effects" VALUES (1)`);
          await whenAborted(context.signal);
          context.signal.throwIfAborted();
        } catch (error) {
          next(error);
        }
      });
      app.use(idempotencyErrors());
      const server = app.listen(0, '127.0.0.1');
      await once(server, 'listening');
      const port = (server.address() as AddressInfo).port;
      try {
        const first = await post(port, '/charges', 'tx-1');
        expect(first.status).toBe(503);
        expect(first.headers['retry-after']).toBe('1');
        expect(JSON.parse(first.body)).toMatchObject({ code: 'lease_lost', retryable: true });
        const retry = await post(port, '/charges', 'tx-1');
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        expect(runs).toBe(2);
        expect((await pool.query(`SELECT count(*)::int AS n FROM "${table}_effects"`)).rows[0].n).toBe(0);
        expect(events.filter((event) => event.type === 'complete')).toEqual([]);
      } finally {
        server.closeAllConnections();
        await new Promise((resolve) => server.close(resolve));
      }
    }, 20_000);
  },
);
