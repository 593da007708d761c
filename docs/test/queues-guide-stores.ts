// The shared stores of queues-guide.int.test.ts and of the consumer process it kills: the engine's
// store (Redis or PostgreSQL) and, beside it, where the test's `chargeCard` counts its effects (a
// Redis counter, or a row per effect in a PostgreSQL table), so two processes count into one place.
import {
  createIdempotency,
  type Duration,
  type IdempotencyEngine,
  type IdempotencyEvent,
  type IdempotencyOptions,
  type Store,
} from '@idem/core';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { Redis } from 'ioredis';
import pg from 'pg';

export type StoreKind = 'redis' | 'postgres';

/** Where one test keeps its records and effects: its own Redis prefix, or its own tables. */
export interface StorePlace {
  kind: StoreKind;
  url: string;
  /** A Redis key prefix, or a PostgreSQL table name: unique to the test. */
  name: string;
}

export interface OpenStore {
  store: Store;
  /** Counts one effect of the order (what charging the card did). */
  effect(orderId: string): Promise<void>;
  /** How many effects the order has had, from every process. */
  effects(orderId: string): Promise<number>;
  close(): Promise<void>;
}

export async function openStore(place: StorePlace): Promise<OpenStore> {
  if (place.kind === 'redis') {
    const client = new Redis(place.url, { maxRetriesPerRequest: 1 });
    const counter = (orderId: string) => `${place.name}effects:${orderId}`;
    return {
      store: redisStore({ client, prefix: place.name }),
      effect: async (orderId) => void (await client.incr(counter(orderId))),
      effects: async (orderId) => Number((await client.get(counter(orderId))) ?? 0),
      close: async () => void (await client.quit()),
    };
  }
  const pool = new pg.Pool({ connectionString: place.url, max: 4 });
  pool.on('error', () => undefined);
  const effects = `${place.name}_effects`;
  return {
    store: postgresStore({ client: pool, table: place.name }),
    effect: async (orderId) => void (await pool.query(`INSERT INTO "${effects}" (order_id) VALUES ($1)`, [orderId])),
    effects: async (orderId) =>
      Number((await pool.query(`SELECT count(*) AS n FROM "${effects}" WHERE order_id = $1`, [orderId])).rows[0].n),
    close: () => pool.end(),
  };
}

/** Creates the place's tables (PostgreSQL); returns what removes everything the test left there. */
export async function preparePlace(place: StorePlace): Promise<() => Promise<void>> {
  if (place.kind === 'redis') {
    const client = new Redis(place.url, { maxRetriesPerRequest: 1 });
    return async () => {
      let cursor = '0';
      do {
        const [next, keys] = await client.scan(cursor, 'MATCH', `${place.name}*`, 'COUNT', 1000);
        cursor = next;
        if (keys.length > 0) await client.unlink(...keys);
      } while (cursor !== '0');
      await client.quit();
    };
  }
  const pool = new pg.Pool({ connectionString: place.url, max: 2 });
  pool.on('error', () => undefined);
  await migrate(pool, { table: place.name });
  // No unique constraint: a second effect must show as a second row, not as an error.
  await pool.query(`CREATE TABLE "${place.name}_effects" (order_id text NOT NULL)`);
  return async () => {
    await pool.query(`DROP TABLE IF EXISTS "${place.name}_effects"`);
    await pool.query(`DROP TABLE IF EXISTS "${place.name}"`);
    await pool.end();
  };
}

/** What a test sets beside the guide's settings: `wait` (the guide's `'15s'`), `conflictRetryAfter`. */
export type EngineExtras = Pick<IdempotencyOptions, 'wait' | 'conflictRetryAfter' | 'storeOutcome'>;

/**
 * A consumer process's engine, as the guide's "Settings for consumers" has it but, unless `extras`
 * sets it, without `wait`, so a copy that finds its key in progress takes the guide's redelivery
 * path (nack or nak after `retryAfter`).
 */
export function consumerEngine(
  store: Store,
  lease: Duration,
  onEvent?: (event: IdempotencyEvent) => void,
  extras: EngineExtras = {},
): IdempotencyEngine {
  return createIdempotency({ store, storeOutcome: 'stripe', lease, ...extras, ...(onEvent ? { onEvent } : {}) });
}
