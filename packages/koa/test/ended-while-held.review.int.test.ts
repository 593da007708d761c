// Review of Koa's held capture (`endedWhileHeld`): a handler that ends `ctx.res` itself inside the
// transaction, without `ctx.respond = false`, then throws, and an app error handler mounted above
// idempotency() catches it and sets a body of its own. Koa must write nothing over the held end
// (`ctx.headerSent` reads true, as Node would say), over HTTP/1.1 and HTTP/2: the rollback's 503 goes
// out whole. Real PostgreSQL.
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { idempotency } from '@idem/koa';
import { migrate, postgresStore } from '@idem/postgres';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import Koa from 'koa';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the Koa ended-while-held review',
);

describe.runIf(withPostgres)(
  'Koa transactional: a handler ends ctx.res itself, then throws to an app error handler',
  () => {
    const table = `idem_koa_ended_held_${randomBytes(4).toString('hex')}`;
    let pool: pg.Pool;
    beforeAll(async () => {
      pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
      pool.on('error', () => undefined);
      await migrate(pool, { table });
    });
    afterAll(async () => {
      await pool.query(`DROP TABLE IF EXISTS "${table}"`);
      await pool.end();
    });

    function callback() {
      const app = new Koa();
      app.silent = true;
      const caught: { headerSent: boolean }[] = [];
      app.use(async (ctx, next) => {
        try {
          await next();
        } catch {
          caught.push({ headerSent: ctx.headerSent });
          ctx.status = 500;
          ctx.body = { error: 'wrapped' };
        }
      });
      app.use(async (ctx, next) => {
        ctx.state.auth = { sub: 'user-1', iss: 'https://issuer.test' } as never;
        await next();
      });
      app.use(idempotency({ store: postgresStore({ client: pool, table }), transactional: true, storeTimeout: '15s' }));
      app.use(async (ctx) => {
        ctx.res.writeHead(201, { 'content-type': 'application/json' });
        ctx.res.end('{"ok":true}');
        throw new Error('after the end');
      });
      return { handle: app.callback(), caught };
    }

    it('over HTTP/1.1 and HTTP/2 the error handler writes nothing over the held end; 503 store_unavailable goes out whole', async () => {
      const h1 = callback();
      const server = http.createServer(h1.handle);
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      const h2 = callback();
      const server2 = http2.createServer(h2.handle);
      await new Promise<void>((resolve) => server2.listen(0, '127.0.0.1', resolve));
      try {
        const one = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/charges`, {
          method: 'POST',
          headers: { 'idempotency-key': 'h1', 'content-type': 'application/json' },
          body: '{}',
        });
        expect(one.status).toBe(503);
        expect(((await one.json()) as { code: string }).code).toBe('store_unavailable');
        const two = await postH2((server2.address() as AddressInfo).port, 'h2');
        expect(two.error).toBeUndefined();
        expect(two.status).toBe(503);
        expect((JSON.parse(two.body) as { code: string }).code).toBe('store_unavailable');
        expect([...h1.caught, ...h2.caught]).toEqual([{ headerSent: true }, { headerSent: true }]);
      } finally {
        server.closeAllConnections();
        await new Promise((resolve) => server.close(resolve));
        await new Promise((resolve) => server2.close(resolve));
      }
    });
  },
);

function postH2(port: number, key: string): Promise<{ status: number; body: string; error?: string }> {
  const client = http2.connect(`http://127.0.0.1:${port}`);
  return new Promise((resolve) => {
    const req = client.request({
      ':method': 'POST',
      ':path': '/charges',
      'idempotency-key': key,
      'content-type': 'application/json',
    });
    let status = 0;
    let body = '';
    req.on('response', (headers) => {
      status = Number(headers[':status']);
    });
    req.on('data', (chunk: Buffer) => {
      body += chunk.toString();
    });
    req.on('end', () => {
      client.close();
      resolve({ status, body });
    });
    req.on('error', (error) => {
      client.close();
      resolve({ status, body, error: error.message });
    });
    req.end('{}');
  });
}
