// Audit (branch audit-deploy): a rolling deploy that changes idem's configuration. For minutes two
// configurations serve the same keys from one store, and a client's retry lands on either. Here the
// first request runs on an Express server of the old configuration, and its retry goes to the
// Express, Fastify and Koa servers of the new one, all on ONE real store (Redis; PostgreSQL for
// transactional mode). docs/operations.md ("Changing the configuration of a live service") says
// which changes are safe; its rows are checked here.
import { randomBytes, randomUUID } from 'node:crypto';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';
import { type Fleet, frameworkNames, type Send, startFleet, to, totalRuns } from './audit-support/cross-framework.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const skipped = 'the rolling-configuration audit over it';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);
const withPostgres = serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), skipped);
const tag = randomBytes(4).toString('hex');
// Shared services on a small box: a slow answer must not read as an unreachable store.
const storeTimeout = '15s';

type Options = Record<string, unknown>;
interface Version {
  options?: Options;
  appWide?: boolean;
}

// A client timestamp in the body and an API version header: what `fingerprint.exclude` and
// `fingerprint.headers` are for.
const charge: Send = {
  path: '/charges',
  contentType: 'application/json',
  body: '{"amount":1000,"sentAt":"2026-12-04T10:00:00Z"}',
  headers: [['Api-Version', '2026-01']],
};
const patch: Send = { method: 'PATCH', path: '/charges/ch_1', contentType: 'application/json', body: '{"amount":5}' };

/**
 * `send` runs on the old version's Express server; the very same request is then retried on every
 * framework of the new version. Returns the retries' answers (status, replayed or not, or the
 * problem's code) and how many times the handler ran in all.
 */
async function retryAcross(before: Fleet, after: Fleet, send: Send) {
  const key = randomUUID();
  const runs = totalRuns(before) + totalRuns(after);
  const first = await to(before, 'express', { ...send, key });
  expect(first.status).toBe(201);
  const answers: Record<string, string> = {};
  for (const framework of frameworkNames) {
    const again = await to(after, framework, { ...send, key });
    const parsed = JSON.parse(again.body) as { code?: string; ranOn?: string };
    // A problem's code; else whether it is a replay, and which framework ran the answer it carries.
    answers[framework] =
      again.headers['content-type'] === 'application/problem+json'
        ? `${again.status} ${parsed.code}`
        : `${again.status} ${again.headers['idempotent-replayed'] === 'true' ? 'replayed' : 'ran'} on ${parsed.ranOn}`;
  }
  return { first, answers, runs: totalRuns(before) + totalRuns(after) - runs };
}

const everywhere = (answer: string) => Object.fromEntries(frameworkNames.map((framework) => [framework, answer]));

describe.runIf(withRedis)('a rolling configuration change on one Redis store', () => {
  const prefix = `audit-deploy:rolling:${tag}:`;
  let client: Redis;
  let n = 0;
  const fleets: Fleet[] = [];
  beforeAll(() => {
    client = new Redis(redisUrl);
  });
  afterAll(async () => {
    await Promise.all(fleets.map((fleet) => fleet.close()));
    await deleteKeys(client, prefix);
    await client.quit();
  });

  /** Two versions on one store (its own prefix per case): the old one and the new one. */
  const versions = async (old: Version, next: Version, storePrefix = `${prefix}${++n}:`) => {
    const store = redisStore({ client, prefix: storePrefix });
    const start = (version: Version, at = store) =>
      startFleet({ store: at, appWide: version.appWide ?? false, extra: { storeTimeout, ...version.options } });
    const before = await start(old);
    const nextStore = next.options?.store as ReturnType<typeof redisStore> | undefined;
    const after = await start(next, nextStore ?? store);
    fleets.push(before, after);
    return { before, after };
  };

  it.each<[string, Options, Options]>([
    ['lease 10s to 30s', { lease: '10s' }, { lease: '30s' }],
    ['retention 24h to 48h', { retention: '24h' }, { retention: '48h' }],
    ['maxExecution off to 5s', {}, { maxExecution: '5s' }],
    ["storeOutcome 'all' to 'success'", { storeOutcome: 'all' }, { storeOutcome: 'success' }],
    ['mintKeys off to on', {}, { mintKeys: true }],
    ['required on to off', {}, { required: false }],
    ['maxResponseBytes 1 MiB to 16 bytes (below the stored response)', {}, { maxResponseBytes: 16 }],
    ['advertiseExpiry off to on', {}, { advertiseExpiry: true }],
    ['mismatchStatus 422 to 400', {}, { mismatchStatus: 400 }],
    ['wait off to 2s', {}, { wait: '2s' }],
    ['replayCache off to 1s', {}, { replayCache: { ttl: '1s' } }],
  ])(
    'holds: %s: the retry replays on every framework of the new version, and nothing runs twice',
    async (_name, old, next) => {
      const { before, after } = await versions({ options: old }, { options: next });
      const { answers, runs } = await retryAcross(before, after, charge);
      expect(answers).toEqual(everywhere('201 replayed on express'));
      expect(runs).toBe(1);
    },
  );

  it('holds: replayHeaders shortened: the replay on the new version leaves out the header it no longer lists', async () => {
    // The fleet replays x-charge-version by default; the new version replays no extra header.
    const { before, after } = await versions({}, { options: { replayHeaders: [] } });
    const key = randomUUID();
    const first = await to(before, 'express', { ...charge, key });
    expect(first.headers['x-charge-version']).toBeDefined();
    for (const framework of frameworkNames) {
      const again = await to(after, framework, { ...charge, key });
      expect(again.headers['idempotent-replayed'], framework).toBe('true');
      expect(again.headers['x-charge-version'], framework).toBeUndefined();
    }
    // ...and the old version still gives it, from the same record.
    expect((await to(before, 'koa', { ...charge, key })).headers['x-charge-version']).toBe(
      first.headers['x-charge-version'],
    );
  });

  // Was wrong: the fingerprint hashes the request as the options shape it, and the record keeps only
  // that hash. Adding a volatile field to `fingerprint.exclude` (or a header to `fingerprint.headers`)
  // changed the hash of every request, so the retry of a request sent byte for byte the same was
  // refused 422 fingerprint_mismatch by every instance of the new version, for the whole retention.
  // Fixed by `fingerprint.previous`: the new version lists the settings the old one had (here none),
  // and on a mismatch fingerprints the request under them too (docs/operations.md).
  it.each<[string, Options]>([
    ['fingerprint.exclude gains /sentAt', { fingerprint: { exclude: ['/sentAt'], previous: [{}] } }],
    ['fingerprint.headers gains api-version', { fingerprint: { headers: ['api-version'], previous: [{}] } }],
  ])('%s: the retry of the very same request replays on the new version, not 422', async (_name, next) => {
    const { before, after } = await versions({}, { options: next });
    const { answers, runs } = await retryAcross(before, after, charge);
    expect(runs).toBe(1);
    expect(answers).toEqual(everywhere('201 replayed on express'));
  });

  // docs/operations.md: `previous` covers the new version's instances only. An instance still on the
  // old version knows nothing of the new settings, so a request the new version stored and retried
  // there is refused until the old instances are gone (pinned)...
  it('pinned: fingerprint.exclude gains /sentAt: a retry of a request the new version stored is refused 422 by the old', async () => {
    const { before, after } = await versions(
      { options: { fingerprint: { exclude: ['/sentAt'], previous: [{}] } } },
      {},
    );
    const { answers, runs } = await retryAcross(before, after, charge);
    expect(answers).toEqual(everywhere('422 fingerprint_mismatch'));
    expect(runs).toBe(1);
  });

  // ...unless the change ships in two deploys: first the old settings with the new ones in `previous`,
  // then the new settings with the old ones in `previous`. During the second, either version replays
  // a request the other stored.
  it('holds: fingerprint.exclude gains /sentAt in two deploys: the retry replays on either version, whichever stored it', async () => {
    const { before, after } = await versions(
      { options: { fingerprint: { previous: [{ exclude: ['/sentAt'] }] } } },
      { options: { fingerprint: { exclude: ['/sentAt'], previous: [{}] } } },
    );
    for (const [first, then] of [
      [before, after],
      [after, before],
    ] as const) {
      const { answers, runs } = await retryAcross(first, then, charge);
      expect(answers).toEqual(everywhere('201 replayed on express'));
      expect(runs).toBe(1);
    }
  });

  // Pinned (docs/operations.md): the changes that move a record where the new version never looks.
  // The first retry there is a new request and runs the operation a second time; the new version's
  // other servers then replay that second run.
  const ranAgain = {
    express: '201 ran on express',
    fastify: '201 replayed on express',
    koa: '201 replayed on express',
  };
  it.each<[string, Version, Version, Send]>([
    ['another scope function', {}, { options: { scope: () => 'tenant-1' } }, charge],
    ['Express and Koa mounted app-wide, then per route', { appWide: true }, {}, patch],
  ])('pinned: %s: the retry runs the operation again on the new version', async (_name, old, next, send) => {
    const { before, after } = await versions(old, next);
    const { answers, runs } = await retryAcross(before, after, send);
    expect(answers).toEqual(ranAgain);
    expect(runs).toBe(2);
  });

  it('pinned: another key prefix (or table, or store): the retry runs the operation again on the new version', async () => {
    const moved = redisStore({ client, prefix: `${prefix}${++n}:moved:` });
    const { before, after } = await versions({}, { options: { store: moved } });
    const { answers, runs } = await retryAcross(before, after, charge);
    expect(answers).toEqual(ranAgain);
    expect(runs).toBe(2);
  });

  it('pinned: a method dropped from methods: every retry with that method runs, on every server of the new version', async () => {
    const { before, after } = await versions({}, { options: { methods: ['POST'] } });
    const { answers, runs } = await retryAcross(before, after, patch);
    expect(answers).toEqual({ express: '201 ran on express', fastify: '201 ran on fastify', koa: '201 ran on koa' });
    expect(runs).toBe(4);
  });
});

describe.runIf(withPostgres)('a rolling configuration change on one PostgreSQL store', () => {
  const table = `audit_deploy_rolling_${tag}`;
  let pool: pg.Pool;
  const fleets: Fleet[] = [];
  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
    pool.on('error', () => undefined);
    await migrate(pool, { table });
  });
  afterAll(async () => {
    await Promise.all(fleets.map((fleet) => fleet.close()));
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  it.each([
    ['transactional on to off', true, false],
    ['transactional off to on', false, true],
  ])('holds: %s: the retry replays on every framework of the new version', async (_name, old, next) => {
    const store = postgresStore({ client: pool, table });
    const before = await startFleet({ store, extra: { storeTimeout, transactional: old } });
    const after = await startFleet({ store, extra: { storeTimeout, transactional: next } });
    fleets.push(before, after);
    const { answers, runs } = await retryAcross(before, after, charge);
    expect(answers).toEqual(everywhere('201 replayed on express'));
    expect(runs).toBe(1);
  });
});
