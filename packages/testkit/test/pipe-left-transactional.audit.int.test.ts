// pipe-left.audit.test.ts in transactional mode (PostgreSQL): a client that leaves before the first
// chunk of a body stream piped into its held response. Nothing went out and nothing can be stored
// with the transaction, so the transaction rolls back and the key is released: the retry runs the
// operation, whose first run left no effect. Waited for instead, the transaction stayed open and the
// key in progress (409) for as long as the process lived.
import { randomBytes, randomUUID } from 'node:crypto';
import { migrate, postgresStore } from '@idem/postgres';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  type PipeLeftServer,
  type PipeLeftServerName,
  postSlow,
  startPipeLeftServer,
  within,
} from './audit-support/pipe-left-servers.js';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the transactional pipe-left audit',
);
const table = `audit_pipe_left_${randomBytes(4).toString('hex')}`;
let pool: pg.Pool;

beforeAll(async () => {
  if (!withPostgres) return;
  pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
  pool.on('error', () => undefined);
  await migrate(pool, { table });
});
afterAll(async () => {
  if (!withPostgres) return;
  await pool.query(`DROP TABLE IF EXISTS "${table}"`);
  await pool.end();
});

const servers: PipeLeftServer[] = [];
afterEach(async () => {
  while (servers.length > 0) await servers.pop()?.close();
});

const cases: Array<[PipeLeftServerName, boolean]> = [
  ['express-pipeline', false],
  ['express-pipe', false],
  ['fastify', false],
  ['fastify', true],
  ['koa', false],
  ['koa', true],
  ['koa-raw', false],
  ['koa-raw', true],
];

describe.runIf(withPostgres)(
  'transactional: a client that leaves before the first chunk of a piped body stream',
  () => {
    it.each(cases)(
      '%s (HTTP/2: %s): the transaction rolls back and the key is released, the retry runs',
      async (name, http2) => {
        const server = await startPipeLeftServer(name, postgresStore({ client: pool, table }), {
          http2,
          extra: { transactional: true },
        });
        servers.push(server);
        const key = randomUUID();
        expect(await postSlow(server, key, server.piped)).toBeUndefined();
        const events = await within(server.settled, 8000, 'the key settled');
        expect(events.map((event) => event.type)).toContain('release');
        const retry = await postSlow(server, key);
        expect(retry?.status).toBe(201);
        expect(retry?.headers['idempotent-replayed']).toBeUndefined();
        expect(retry?.body).toBe('second run');
        expect(server.runs()).toBe(2);
      },
      20_000,
    );
  },
);
