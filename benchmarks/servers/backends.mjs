// The shared Redis and PostgreSQL of the machine (REDIS_URL, DATABASE_URL), opened by a server child
// for one contender and cleaned up when it stops: every contender writes under a prefix or into a
// table of its own, so parallel test files and earlier rounds never see its records.
import { randomUUID } from 'node:crypto';

/** The machine's Redis, as every test and bench in the repository finds it. */
export const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
/** The machine's PostgreSQL, as every test and bench in the repository finds it. */
export const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/**
 * An idem store of `kind` ('memory' | 'redis' | 'postgres') with a `close()` that deletes what it wrote.
 *
 * @example
 * const { store, close } = await idemStore('redis');
 */
export async function idemStore(kind) {
  if (kind === 'memory') {
    const { memoryStore } = await import('@idem/core');
    return { store: memoryStore({ maxEntries: 1_000_000 }), close: async () => {} };
  }
  if (kind === 'redis') {
    // node-redis, as the peers' Redis adapters use: the figures then compare libraries, not clients
    // (ioredis without auto-pipelining is the slower client at 50 in flight; see the function rows).
    const { redisStore } = await import('@idem/redis');
    const { createClient } = await import('redis');
    const client = await createClient({ url: redisUrl }).connect();
    const prefix = `idem-bench:${randomUUID()}:`;
    return {
      store: redisStore({ client, prefix }),
      close: async () => {
        const cleaner = await ioredisClient();
        await deleteRedisKeys(cleaner, prefix);
        cleaner.disconnect();
        await client.quit();
      },
    };
  }
  if (kind === 'postgres') {
    const { migrate, postgresStore } = await import('@idem/postgres');
    const pool = await pgPool();
    const table = `idem_bench_${randomUUID().slice(0, 8)}`;
    await migrate(pool, { table });
    return {
      store: postgresStore({ client: pool, table }),
      close: async () => {
        await pool.query(`DROP TABLE IF EXISTS "${table}"`);
        await pool.end();
      },
    };
  }
  throw new TypeError(`unknown store ${kind}`);
}

/**
 * A connected ioredis client on REDIS_URL that fails fast instead of queueing when Redis is gone.
 *
 * @example
 * const client = await ioredisClient();
 */
export async function ioredisClient() {
  const { Redis } = await import('ioredis');
  const client = new Redis(redisUrl, { maxRetriesPerRequest: 1, enableOfflineQueue: true });
  client.on('error', () => {});
  await client.ping();
  return client;
}

/**
 * A pg Pool on DATABASE_URL, sized like research/perf-limits.md's best PostgreSQL figure (32 clients).
 *
 * @example
 * const pool = await pgPool();
 */
export async function pgPool() {
  const pg = (await import('pg')).default;
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 32 });
  pool.on('error', () => {});
  await pool.query('SELECT 1');
  return pool;
}

/**
 * Deletes every key under `prefix` with SCAN + UNLINK (never KEYS: the Redis is shared).
 *
 * @example
 * await deleteRedisKeys(client, 'idem-bench:1234:');
 */
export async function deleteRedisKeys(client, prefix) {
  let cursor = '0';
  do {
    const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 5_000);
    cursor = next;
    if (keys.length > 0) await client.unlink(...keys);
  } while (cursor !== '0');
}
