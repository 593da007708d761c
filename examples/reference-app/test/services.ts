// Where the app's HTTP-level tests keep their data. By default: in-memory PGlite and no Redis (the
// embedded default of `npm start`). With DATABASE_URL set: PostgreSQL, in a schema of the test file's
// own, dropped afterwards. With REDIS_URL set: Redis for the routes that are not transactional, under
// a key prefix of the file's own. So one suite runs both ways (root script `test:app:services`).
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { type Database, openDatabase } from '../src/db.js';

/**
 * Opens the test database; `name` goes into the PostgreSQL schema so a stray one says whose it is.
 * `embedded`: an in-memory PGlite whatever DATABASE_URL says.
 */
export async function openTestDatabase(name: string, options: { embedded?: boolean } = {}): Promise<Database> {
  const url = process.env.DATABASE_URL;
  if (!url || options.embedded) return openDatabase({ memory: true });
  const schema = `refapp_${name}_${randomBytes(5).toString('hex')}`;
  const db = await openDatabase({ url, schema });
  return {
    ...db,
    async close() {
      await db.query(`drop schema if exists ${schema} cascade`).catch(() => undefined);
      await db.close();
    },
  };
}

/** Two handles on one test database, and how to close both (dropping the schema on PostgreSQL). */
export interface TwoHandles {
  one: Database;
  two: Database;
  close(): Promise<void>;
}

/**
 * Two handles on one test database, as two app processes behind one load balancer have: two pools
 * on one schema on PostgreSQL (DATABASE_URL), the one PGlite instance twice otherwise or when
 * `embedded` (a single process owns it). `name` goes into the schema as for `openTestDatabase`.
 */
export async function openTestDatabaseTwice(name: string, options: { embedded?: boolean } = {}): Promise<TwoHandles> {
  const url = process.env.DATABASE_URL;
  if (!url || options.embedded) {
    const db = await openDatabase({ memory: true });
    return { one: db, two: db, close: () => db.close() };
  }
  const schema = `refapp_${name}_${randomBytes(5).toString('hex')}`;
  const one = await openDatabase({ url, schema });
  const two = await openDatabase({ url, schema });
  return {
    one,
    two,
    async close() {
      await two.close();
      await one.query(`drop schema if exists ${schema} cascade`).catch(() => undefined);
      await one.close();
    },
  };
}

/** A connected Redis client and a key prefix for this file, or undefined when REDIS_URL is not set. */
export async function openTestRedis(name: string): Promise<{ client: Redis; prefix: string } | undefined> {
  const url = process.env.REDIS_URL;
  if (!url) return undefined;
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 });
  client.on('error', () => undefined);
  await client.connect();
  return { client, prefix: `refapp:${name}:${randomBytes(5).toString('hex')}:` };
}

/** Deletes this file's Redis keys and disconnects. */
export async function closeTestRedis(redis: { client: Redis; prefix: string } | undefined): Promise<void> {
  if (!redis) return;
  let cursor = '0';
  do {
    const [next, keys] = await redis.client.scan(cursor, 'MATCH', `${redis.prefix}*`, 'COUNT', 500);
    if (keys.length > 0) await redis.client.del(...keys);
    cursor = next;
  } while (cursor !== '0');
  redis.client.disconnect();
}
