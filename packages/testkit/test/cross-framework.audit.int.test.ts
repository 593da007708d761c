// The cross-framework fleet of cross-framework.audit.test.ts on the real shared stores a mixed
// fleet or a rolling migration actually uses: Redis (its own key prefix) and PostgreSQL (its own
// table, plain and transactional). Express, Fastify and Koa servers on ONE store instance.
import { randomBytes, randomUUID } from 'node:crypto';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';
import {
  expectReplayedEverywhere,
  type Fleet,
  frameworkNames,
  type Send,
  startFleet,
  to,
} from './audit-support/cross-framework.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const skipped = 'the cross-framework audit over it';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);
const withPostgres = serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), skipped);
const tag = randomBytes(4).toString('hex');
const json = 'application/json';
// Shared services on a small box: a slow answer must not read as an unreachable store.
const storeTimeout = '15s';

const charge: Send = { path: '/charges', contentType: json, body: '{"amount":1000,"currency":"eur"}' };

/** The first still running on `origin`: every other framework answers 409 with Retry-After. */
async function expectBusyElsewhere(make: () => Promise<Fleet>) {
  for (const origin of frameworkNames) {
    const fleet = await make();
    try {
      const send: Send = { path: '/slow', contentType: json, body: '{}', key: randomUUID() };
      const first = to(fleet, origin, send);
      await fleet.slowStarted();
      for (const framework of frameworkNames.filter((f) => f !== origin)) {
        const busy = await to(fleet, framework, send);
        expect(busy.status, `${origin} running, retry on ${framework}`).toBe(409);
        expect(busy.headers['retry-after'], framework).toMatch(/^\d+$/);
      }
      fleet.open();
      expect((await first).status).toBe(201);
      expect(fleet.runs.slow).toBe(1);
    } finally {
      await fleet.close();
    }
  }
}

describe.runIf(withRedis)('one Redis store behind Express, Fastify and Koa', () => {
  const prefix = `idem-test:xframe-audit:${tag}:`;
  let client: Redis;
  let fleet: Fleet;
  let n = 0;
  const store = () => redisStore({ client, prefix: `${prefix}${++n}:` });
  beforeAll(async () => {
    client = new Redis(redisUrl);
    fleet = await startFleet({ store: store(), extra: { storeTimeout } });
  });
  afterAll(async () => {
    await fleet?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('the same request replays on every other framework, runs once, and is 409 on them while it runs', async () => {
    await expectReplayedEverywhere(fleet, charge, [
      { ...charge, body: '{ "currency": "eur", "amount": 1000.0 }', chunked: true },
    ]);
    await expectReplayedEverywhere(fleet, {
      path: '/gz',
      contentType: json,
      body: '{}',
      headers: [['Accept-Encoding', 'gzip']],
    });
    await expectBusyElsewhere(() => startFleet({ store: store(), extra: { storeTimeout } }));
  });
});

describe.runIf(withPostgres)('one PostgreSQL store behind Express, Fastify and Koa', () => {
  const table = `idem_test_xframe_audit_${tag}`;
  let pool: pg.Pool;
  const store = () => postgresStore({ client: pool, table });
  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 10 });
    pool.on('error', () => undefined);
    await migrate(pool, { table });
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  for (const transactional of [false, true]) {
    it(`the same request replays on every other framework, runs once, and is 409 on them while it runs${transactional ? ' (transactional)' : ''}`, async () => {
      const fleet = await startFleet({ store: store(), extra: { storeTimeout, transactional } });
      try {
        await expectReplayedEverywhere(fleet, charge, [
          { ...charge, body: '{ "currency": "eur", "amount": 1000.0 }', chunked: true },
        ]);
        await expectReplayedEverywhere(fleet, { path: '/empty', contentType: json, body: '{}' });
        await expectReplayedEverywhere(fleet, {
          path: '/gz',
          contentType: json,
          body: '{}',
          headers: [['Accept-Encoding', 'gzip']],
        });
      } finally {
        await fleet.close();
      }
      await expectBusyElsewhere(() => startFleet({ store: store(), extra: { storeTimeout, transactional } }));
    });
  }
});
