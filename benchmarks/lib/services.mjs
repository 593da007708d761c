// Whether the machine's Redis and PostgreSQL answer, checked once before the suites run, so their
// scenarios are listed as "not measured" with the reason instead of failing one by one.
import { databaseUrl, redisUrl } from '../servers/backends.mjs';

const timeoutMs = 3_000;

function withTimeout(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not answer within ${timeoutMs} ms`)), timeoutMs);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/**
 * `{ redis, postgres }`: `undefined` for a service that answered, else why it did not.
 *
 * @example
 * const services = await checkServices(); // { redis: undefined, postgres: 'connect ECONNREFUSED ...' }
 */
export async function checkServices() {
  const result = { redis: undefined, postgres: undefined };
  try {
    const { Redis } = await import('ioredis');
    const client = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    client.on('error', () => {});
    try {
      await withTimeout(
        client.connect().then(() => client.ping()),
        redisUrl,
      );
    } finally {
      client.disconnect();
    }
  } catch (error) {
    result.redis = error instanceof Error ? error.message : String(error);
  }
  try {
    const pg = (await import('pg')).default;
    const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: timeoutMs });
    client.on('error', () => {});
    try {
      await client.connect();
      await client.query('SELECT 1');
    } finally {
      await client.end().catch(() => {});
    }
  } catch (error) {
    result.postgres = (error instanceof Error ? error.message : String(error)).replace(/:\/\/[^@/]*@/, '://***@');
  }
  return result;
}
