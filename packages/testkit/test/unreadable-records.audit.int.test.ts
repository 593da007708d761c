// Audit (branch audit-deploy): records in a shared store that this version cannot replay as they are.
// During a rolling deploy, a restore from a backup, or after a hand-rolled tool or migration wrote
// to the store, a retry may find a completed record whose response no HTTP server can send: a status
// outside 100-599, a header value with a line break, or (PostgreSQL) a completed row without its
// status, headers or body. The rule (docs/errors.md, "a value idem did not write under the
// prefix"): such a record is never replayed as if it were an answer, never a framework's 500; it is
// a 503 store_unavailable with a store-error event that says why, and nothing runs.
// Express, Fastify and Koa on ONE real store (Redis, then PostgreSQL); raw records written by hand.
import { randomBytes, randomUUID } from 'node:crypto';
import { type IdempotencyEvent, principalScope, recordId } from '@idem/core';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';
import {
  type Fleet,
  type FrameworkName,
  frameworkNames,
  ISSUER,
  type Send,
  startFleet,
  to,
} from './audit-support/cross-framework.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const skipped = 'the unreadable-record audit over it';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);
const withPostgres = serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), skipped);
const tag = randomBytes(4).toString('hex');
// Shared services on a small box: a slow answer must not read as an unreachable store.
const storeTimeout = '15s';

const charge: Send = { path: '/charges', contentType: 'application/json', body: '{"amount":1000}' };
// The record of `key` for the fleet's default caller (the guard's principal, user-1) on POST /charges.
const idOf = (key: string) => recordId(principalScope({ sub: 'user-1', iss: ISSUER }) as string, 'POST /charges', key);

/**
 * The first request runs on Express and is stored; `spoil` then rewrites its record. Every
 * framework's retry must be a 503 store_unavailable problem that runs nothing, with a store-error
 * event whose error says the record could not be read: a `StoreUnavailableError`, or Redis's
 * `RecordFormatError` for a value its codec cannot decode (a store that answered, so that
 * `storeUnavailable: 'fail-open'` stays closed on it).
 */
async function expectRefusedEverywhere(
  fleet: Fleet,
  events: IdempotencyEvent[],
  spoil: (id: string) => Promise<void>,
  errorName = 'StoreUnavailableError',
) {
  const key = randomUUID();
  const first = await to(fleet, 'express', { ...charge, key });
  expect(first.status).toBe(201);
  await spoil(idOf(key));
  const runs = fleet.runs.charges;
  const answers: Record<string, string> = {};
  for (const framework of frameworkNames) {
    events.length = 0;
    const retry = await to(fleet, framework as FrameworkName, { ...charge, key });
    const problem = retry.headers['content-type'] === 'application/problem+json' ? JSON.parse(retry.body) : undefined;
    const failure = events.find((event) => event.type === 'store-error') as { error: Error } | undefined;
    answers[framework] =
      `${retry.status} ${problem?.code ?? retry.body.replace(/\s+/g, ' ').slice(0, 60)} ` +
      `retry-after=${retry.headers['retry-after']} store-error=${failure?.error.name}`;
  }
  const refused = `503 store_unavailable retry-after=2 store-error=${errorName}`;
  expect(answers).toEqual(Object.fromEntries(frameworkNames.map((framework) => [framework, refused])));
  expect(fleet.runs.charges).toBe(runs);
}

describe.runIf(withRedis)('Redis: a completed record this version cannot replay', () => {
  const prefix = `audit-deploy:unreadable:${tag}:`;
  const events: IdempotencyEvent[] = [];
  let client: Redis;
  let fleet: Fleet;
  beforeAll(async () => {
    client = new Redis(redisUrl);
    const store = redisStore({ client, prefix });
    fleet = await startFleet({
      store,
      extra: { storeTimeout, onEvent: (event: IdempotencyEvent) => events.push(event) },
    });
  });
  afterAll(async () => {
    await fleet?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  // The claim and fingerprint lines of the record as idem wrote them, then `meta` and `body`.
  const rewrite =
    (meta: string, body = '{"id":"ch_1"}') =>
    async (id: string) => {
      const value = (await client.getBuffer(prefix + id)) as Buffer;
      const head = value.subarray(0, value.indexOf(0x0a, value.indexOf(0x0a) + 1) + 1);
      await client.set(prefix + id, Buffer.concat([head, Buffer.from(`${meta}\n${body}`)]), 'PX', 60_000);
    };

  it('holds: a value in a format this version does not know (another version, another app) is 503 everywhere', async () => {
    await expectRefusedEverywhere(
      fleet,
      events,
      async (id) => {
        await client.set(prefix + id, 'v9{"state":"completed","status":201}', 'PX', 60_000);
      },
      'RecordFormatError',
    );
  });

  it('holds: a record cut short in its status line is 503 everywhere', async () => {
    await expectRefusedEverywhere(
      fleet,
      events,
      async (id) => {
        const value = (await client.getBuffer(prefix + id)) as Buffer;
        await client.set(prefix + id, value.subarray(0, value.lastIndexOf(0x0a) - 3), 'PX', 60_000);
      },
      'RecordFormatError',
    );
  });

  // Was wrong: the codec checks that the status is a number and the headers strings, no more. A
  // status of 0, 99 or 1000 reached writeHead, which threw: each framework's own 500 (Express's HTML
  // page with the stack trace outside production), no event; 200.5 was replayed as a 200.
  it.each([
    ['status 0', '{"s":0,"h":{}}'],
    ['status 1000', '{"s":1000,"h":{}}'],
    ['status 200.5', '{"s":200.5,"h":{}}'],
  ])('a completed record with %s is 503 everywhere, never a 500 or a replay', async (_name, meta) => {
    await expectRefusedEverywhere(fleet, events, rewrite(meta));
  });

  // Was wrong: a header value with a line break passed the codec and made writeHead throw: 500.
  it('a completed record whose header value holds a line break is 503 everywhere', async () => {
    await expectRefusedEverywhere(
      fleet,
      events,
      rewrite('{"s":201,"h":{"content-type":"application/json\\r\\nset-cookie: a=b"}}'),
    );
  });
});

describe.runIf(withPostgres)('PostgreSQL: a completed row this version cannot replay', () => {
  const table = `audit_deploy_unreadable_${tag}`;
  const events: IdempotencyEvent[] = [];
  let pool: pg.Pool;
  let fleet: Fleet;
  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
    pool.on('error', () => undefined);
    await migrate(pool, { table });
    const store = postgresStore({ client: pool, table });
    fleet = await startFleet({
      store,
      extra: { storeTimeout, onEvent: (event: IdempotencyEvent) => events.push(event) },
    });
  });
  afterAll(async () => {
    await fleet?.close();
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  // Was wrong: the store read a NULL status as 0 (writeHead threw: a framework's 500), NULL headers
  // as none and a NULL body as an empty one (a 201 replayed without its body or its content-type),
  // and replayed headers that are no header map: `{"content-type": 5}` went out as `content-type: 5`,
  // an object as `[object Object]`. A row the store's own complete() never writes is no answer.
  it.each([
    ['status NULL', 'status = NULL'],
    ['status 0', 'status = 0'],
    ['status 1000', 'status = 1000'],
    ['headers NULL', 'headers = NULL'],
    ['body NULL', 'body = NULL'],
    ['headers a JSON string', `headers = '"content-type"'`],
    ['a header value a number', `headers = '{"content-type": 5}'`],
    ['a header value an object', `headers = '{"content-type": {"a": 1}}'`],
    ['a header value with a line break', `headers = '{"content-type": "a\\r\\nset-cookie: x=y"}'`],
  ])('a completed row with %s is 503 everywhere, never a 500 or a replay', async (_name, set) => {
    await expectRefusedEverywhere(fleet, events, async (id) => {
      const { rowCount } = await pool.query(`UPDATE "${table}" SET ${set} WHERE id = $1`, [id]);
      expect(rowCount).toBe(1);
    });
  });
});
