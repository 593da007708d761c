// Model-based audit of the Redis and PostgreSQL stores: the random histories of model.audit.test.ts
// (several holders over a few ids: claim with and without `replaces`, renew, complete, release, get,
// time passing) against the reference model (audit-support/store-model.ts), step by step. Their
// clocks are the servers': time passing is played by moving every record of the history the same
// amount closer to its end (Redis: PTTL less the step, in one script; PostgreSQL: expires_at and
// lease_until less the step), which is what the server's clock does. Real time passes too, a few ms,
// so durations come in whole units of 5 s (coarseDurations): no step lands just short of a boundary.
import { randomBytes } from 'node:crypto';
import { migrate, postgresStore } from '@idem/postgres';
import { type RedisStore, redisStore } from '@idem/redis';
import { postgresAnswers, redisAnswers, serviceAvailable } from '@idem/testkit';
import fc from 'fast-check';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';
import { advanceRedisKeys } from './audit-support/redis-clock.js';
import { checkLog, runConcurrently } from './audit-support/store-concurrency.js';
import {
  type Coverage,
  coarseDurations,
  commandArbitrary,
  newCoverage,
  playHistory,
} from './audit-support/store-model.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const skipped = 'the model-based store audit over it';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);
const withPostgres = serviceAvailable(`PostgreSQL at ${databaseUrl}`, await postgresAnswers(databaseUrl), skipped);
const tag = randomBytes(4).toString('hex');
const unitMs = 5_000;

const histories = fc.array(commandArbitrary(coarseDurations(unitMs)), { minLength: 10, maxLength: 40, size: 'max' });
// Each history gets ids of its own, so histories never meet (no flush between them).
let history = 0;
const idsOf = () => {
  history++;
  return ['a', 'b', 'c'].map((name) => `${tag}-${history}-${name}`);
};
const reached = (coverage: Coverage) => {
  for (const [what, count] of Object.entries(coverage)) expect(count, what).toBeGreaterThan(5);
};

describe.runIf(withRedis)('redisStore against the model of the Store contract', () => {
  const prefix = `audit-model:${tag}:`;
  let client: Redis;
  beforeAll(() => {
    client = new Redis(redisUrl);
  });
  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('answers every step of random histories as the model does', async () => {
    const store = redisStore({ client, prefix });
    const coverage = newCoverage();
    await fc.assert(
      fc.asyncProperty(histories, async (commands) => {
        const advance = async (ms: number, ids: readonly string[]) => {
          await advanceRedisKeys(
            client,
            ids.map((id) => store.key(id)),
            ms,
          );
        };
        await playHistory({ store, advance }, commands, idsOf(), coverage);
      }),
      { numRuns: 600 },
    );
    console.info(`[figures] model redis ${JSON.stringify(coverage)}`);
    reached(coverage);
  }, 60_000);
});

/** A pool of `max` connections and a migrated table of its own for one describe block, dropped after it. */
function usePostgresTable(table: string, max: number): { readonly pool: pg.Pool } {
  const held = { pool: undefined as unknown as pg.Pool };
  beforeAll(async () => {
    held.pool = new pg.Pool({ connectionString: databaseUrl, max });
    held.pool.on('error', () => undefined);
    await migrate(held.pool, { table });
  });
  afterAll(async () => {
    await held.pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await held.pool.end();
  });
  return held;
}

describe.runIf(withPostgres)('postgresStore against the model of the Store contract', () => {
  const table = `audit_model_${tag}`;
  const held = usePostgresTable(table, 4);

  it('answers every step of random histories as the model does', async () => {
    const store = postgresStore({ client: held.pool, table });
    const coverage = newCoverage();
    await fc.assert(
      fc.asyncProperty(histories, async (commands) => {
        const advance = async (ms: number, ids: readonly string[]) => {
          await held.pool.query(
            `UPDATE "${table}" SET expires_at = expires_at - $1::float8 * interval '1 millisecond',
               lease_until = lease_until - $1::float8 * interval '1 millisecond' WHERE id = ANY($2)`,
            [ms, ids],
          );
          // Purging what has expired changes no answer: expired records are already unseen. With no
          // grace, a record in progress goes as soon as its lease and keep are over.
          await store.purgeExpired({ inProgressGraceMs: (ms / unitMs) % 2 === 0 ? 0 : 3_600_000 });
        };
        await playHistory({ store, advance }, commands, idsOf(), coverage);
      }),
      { numRuns: 400 },
    );
    console.info(`[figures] model postgres ${JSON.stringify(coverage)}`);
    reached(coverage);
  }, 60_000);
});

// Ends the lease of a record in progress now, in one step, as its holder's crash would: its time
// left becomes its keep (the line after the fingerprint's, see record-codec.ts), or it goes.
const endLeaseScript = `local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'p' then return false end
local tokenEnd = string.find(v, '\\n', 1, true)
local fingerprintEnd = string.find(v, '\\n', tokenEnd + 1, true)
local keep = tonumber(string.sub(v, fingerprintEnd + 1, -2)) or 0
if keep > 0 then redis.call('PEXPIRE', KEYS[1], keep) else redis.call('DEL', KEYS[1]) end
return string.sub(v, 2, tokenEnd - 1)`;

describe.runIf(withRedis)('redisStore under concurrent clients', () => {
  const prefix = `audit-model:${tag}:concurrent:`;
  let client: Redis;
  beforeAll(() => {
    client = new Redis(redisUrl);
  });
  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  it('never grants two live leases, never lets a stale token act, never loses an outcome', async () => {
    const total = { takeovers: 0, endedLeases: 0, completions: 0, fencedLate: 0 };
    for (let seed = 1; seed <= 5; seed++) {
      // Each client on a connection of its own, so their commands really interleave at the server.
      const connections = Array.from({ length: 4 }, () => new Redis(redisUrl));
      try {
        const stores = connections.map((c) => redisStore({ client: c, prefix }));
        let next = 0;
        const store = new Proxy(stores[0] as RedisStore, {
          get: (_, name: keyof RedisStore) => {
            const s = stores[next++ % stores.length] as RedisStore;
            const value = s[name];
            return typeof value === 'function' ? value.bind(s) : value;
          },
        });
        const endLease = async (id: string) => {
          const token = await client.eval(endLeaseScript, 1, store.key(id));
          return typeof token === 'string' ? (JSON.parse(token) as string) : undefined;
        };
        const ids = ['a', 'b', 'c', 'd', 'e'].map((name) => `${tag}-concurrent-${seed}-${name}`);
        const figures = checkLog(await runConcurrently({ store, endLease }, ids, { clients: 6, rounds: 60, seed }));
        for (const key of Object.keys(total) as (keyof typeof total)[]) total[key] += figures[key];
      } finally {
        await Promise.all(connections.map((c) => c.quit()));
      }
    }
    console.info(`[figures] concurrent redis ${JSON.stringify(total)}`);
    for (const [what, count] of Object.entries(total)) expect(count, what).toBeGreaterThan(0);
  }, 60_000);
});

describe.runIf(withPostgres)('postgresStore under concurrent clients', () => {
  const table = `audit_model_concurrent_${tag}`;
  const held = usePostgresTable(table, 8);

  it('never grants two live leases, never lets a stale token act, never loses an outcome', async () => {
    const store = postgresStore({ client: held.pool, table });
    // As a crash would: the lease ends now by the database clock, the keep after it stays.
    const endLease = async (id: string) => {
      const { rows } = await held.pool.query(
        `UPDATE "${table}" SET
           lease_until = CASE WHEN lease_until IS NOT NULL THEN clock_timestamp() - interval '1 millisecond' END,
           expires_at = clock_timestamp() - interval '1 millisecond' + (expires_at - COALESCE(lease_until, expires_at))
         WHERE id = $1 AND state = 'in_progress' AND expires_at > clock_timestamp()
           AND (lease_until IS NULL OR lease_until > clock_timestamp())
         RETURNING token`,
        [id],
      );
      return rows[0]?.token as string | undefined;
    };
    const total = { takeovers: 0, endedLeases: 0, completions: 0, fencedLate: 0 };
    for (let seed = 1; seed <= 6; seed++) {
      const ids = ['a', 'b', 'c', 'd', 'e'].map((name) => `${tag}-concurrent-${seed}-${name}`);
      const figures = checkLog(await runConcurrently({ store, endLease }, ids, { clients: 6, rounds: 50, seed }));
      for (const key of Object.keys(total) as (keyof typeof total)[]) total[key] += figures[key];
    }
    console.info(`[figures] concurrent postgres ${JSON.stringify(total)}`);
    for (const [what, count] of Object.entries(total)) expect(count, what).toBeGreaterThan(0);
  }, 60_000);
});
