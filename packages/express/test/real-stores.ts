// Runs the describeAdapter table over the real Redis and PostgreSQL stores, for any framework's
// test server. Shared by the Express, Fastify and Koa integration files; each call uses its own
// Redis key prefix and its own table, so the files never meet.
import { randomBytes } from 'node:crypto';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import {
  describeAdapter,
  type MakeAdapterServer,
  postgresAnswers,
  redisAnswers,
  serviceAvailable,
} from '@idem/testkit';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, beforeAll, describe } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

// The services are shared with every other test file on a 2-core box: a store call that is merely
// slow must not turn into the 503 of an unreachable store and make a scenario flaky.
const sharedServiceOptions = { storeTimeout: '15s' } as const;

/** Registers the adapter table for `name` over Redis and over PostgreSQL (plain and transactional). */
export async function describeOnRealStores(name: string, makeServer: MakeAdapterServer): Promise<void> {
  const skipped = 'the adapter tables over it';
  const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);
  const withPostgres = serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), skipped);
  const run = randomBytes(4).toString('hex');

  describe.runIf(withRedis)(`${name} over Redis`, () => {
    const prefix = `idem-test:adapter-${name}:${run}:`;
    let client: Redis;
    let scenario = 0;
    beforeAll(() => {
      client = new Redis(redisUrl);
    });
    afterAll(async () => {
      await deleteKeys(client, prefix);
      await client.quit();
    });
    describeAdapter(`${name} on Redis`, makeServer, {
      store: () => ({ store: redisStore({ client, prefix: `${prefix}${++scenario}:` }) }),
      adapterOptions: sharedServiceOptions,
    });
  });

  describe.runIf(withPostgres)(`${name} over PostgreSQL`, () => {
    const table = `idem_test_adapter_${name}_${run}`;
    let pool: pg.Pool;
    beforeAll(async () => {
      pool = new pg.Pool({ connectionString: databaseUrl, max: 10 });
      pool.on('error', () => undefined);
      await migrate(pool, { table });
    });
    afterAll(async () => {
      await pool.query(`DROP TABLE IF EXISTS "${table}"`);
      await pool.end();
    });
    const store = () => ({ store: postgresStore({ client: pool, table }) });
    describeAdapter(`${name} on PostgreSQL`, makeServer, {
      store,
      transactionalStore: store,
      adapterOptions: sharedServiceOptions,
    });
  });
}
