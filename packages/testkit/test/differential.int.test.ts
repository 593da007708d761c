// The differential test of the three adapters on the real Redis and PostgreSQL stores (see
// differential.ts): the same model and the same comparison, at one instant (their clocks are real),
// with keys of each sequence's own.
import { randomBytes } from 'node:crypto';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';
import { type Differential, startDifferential } from './differential.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const skipped = 'the differential test over it';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);
const withPostgres = serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), skipped);
const tag = randomBytes(4).toString('hex');

describe.runIf(withRedis)('the three adapters against one model of the spec, on Redis', () => {
  const prefix = `idem-test:differential:${tag}:`;
  let client: Redis;
  let run: Differential;
  beforeAll(async () => {
    client = new Redis(redisUrl);
    run = await startDifferential({
      store: (framework) => redisStore({ client, prefix: `${prefix}${framework}:` }),
      numRuns: 40,
    });
  }, 30_000);
  afterAll(async () => {
    await run?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('answer every generated sequence as the model says, and alike', async () => {
    const figures = await run.check();
    expect(figures.requests).toBeGreaterThan(200);
    console.info(`[figures] differential redis ${JSON.stringify(figures)}`);
  }, 180_000);
});

describe.runIf(withPostgres)('the three adapters against one model of the spec, on PostgreSQL', () => {
  const table = (framework: string) => `idem_test_differential_${framework}_${tag}`;
  const frameworks = ['express', 'fastify', 'koa'];
  let pool: pg.Pool;
  let run: Differential;
  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 10 });
    pool.on('error', () => undefined);
    for (const framework of frameworks) await migrate(pool, { table: table(framework) });
    run = await startDifferential({
      store: (framework) => postgresStore({ client: pool, table: table(framework) }),
      numRuns: 40,
    });
  }, 30_000);
  afterAll(async () => {
    await run?.close();
    for (const framework of frameworks) await pool.query(`DROP TABLE IF EXISTS "${table(framework)}"`);
    await pool.end();
  });

  it('answer every generated sequence as the model says, and alike', async () => {
    const figures = await run.check();
    expect(figures.requests).toBeGreaterThan(200);
    console.info(`[figures] differential postgres ${JSON.stringify(figures)}`);
  }, 180_000);
});
