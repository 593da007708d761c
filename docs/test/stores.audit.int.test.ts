// Audit of docs/stores.md (and the store sections of docs/operations.md): each claim below was not
// pinned by a test elsewhere (packages/*/test, docs/test), and is checked here against real Redis and
// PostgreSQL, with injected clocks. One describe per section of the page.
import { createHash, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type MemoryStore, memoryStore, type StoredResponse } from '@idem/core';
import { migrate, postgresStore } from '@idem/postgres';
import { type RedisCommandRunner, redisCommandRunner, redisStore } from '@idem/redis';
import { databaseUrl, postgresAnswers, redisAnswers, redisUrl, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import pg from 'pg';
import { createClient } from 'redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const withRedis = serviceAvailable(`Redis at ${redisUrl()}`, await redisAnswers(), 'the stores.md audit on Redis');
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl()}`,
  await postgresAnswers(),
  'the stores.md audit on PostgreSQL',
);

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'stores.md'), 'utf8');
/** The row of a table of the page whose first cell is `name`, after the heading `section`. */
const row = (section: string, name: string): string => {
  const from = page.indexOf(`\n${section}\n`);
  const line = page
    .slice(from)
    .split('\n')
    .find((text) => text.startsWith(`| \`${name}\``));
  if (from < 0 || line === undefined) throw new Error(`docs/stores.md has no row ${name} under ${section}`);
  return line;
};

/** How many listeners a client (or pool) has for each event: a store that subscribed would change it. */
const listeners = (emitter: { eventNames(): (string | symbol)[]; listenerCount(name: string | symbol): number }) =>
  Object.fromEntries(emitter.eventNames().map((name) => [String(name), emitter.listenerCount(name)]));

const prefix = `audit-stores:${randomUUID().slice(0, 8)}:`;
const response = (body: Uint8Array = new Uint8Array()): StoredResponse => ({
  status: 201,
  headers: { 'content-type': 'application/json', location: '/charges/ch_1' },
  body,
});

describe('Memory, and writing a store of your own (and operations.md, Purge jobs: memory)', () => {
  // operations.md, Purge jobs: memory: "invisible at once, swept on writes". Vague: a read of an
  // expired record drops it too, and claims sweep a batch at a time (every 64 claims), not every
  // write. The page now says so.
  it('an expired record is invisible at once, and its memory is given back as later claims come in', () => {
    let t = 1_000_000;
    const store: MemoryStore = memoryStore({ now: () => t });
    for (let i = 0; i < 10; i++) {
      const id = `old-${i}`;
      store.claim({ id, token: `t${i}`, fingerprint: 'f', leaseMs: 1_000 });
      store.complete({ id, token: `t${i}`, response: response(new Uint8Array(1_000)), retentionMs: 5_000 });
    }
    const held = store.bytes;
    t += 5_000; // every retention over
    // Nothing read them yet: held until a write sweeps them (a read of one drops that one).
    expect(store.bytes).toBe(held);
    expect(store.get('old-0')).toBeUndefined();
    expect(store.size).toBe(9);
    for (let i = 0; i < 64; i++) store.claim({ id: `new-${i}`, token: 'n', fingerprint: 'f', leaseMs: 60_000 });
    expect(store.size).toBe(64);
    expect(store.bytes).toBeLessThan(held / 10);
  });
});

describe.runIf(withRedis)('Redis', () => {
  let admin: Redis;
  beforeAll(() => {
    admin = new Redis(redisUrl());
  });
  afterAll(async () => {
    const keys = await admin.keys(`${prefix}*`);
    if (keys.length > 0) await admin.del(...keys);
    await admin.quit();
  });

  const everyOperation = async (store: ReturnType<typeof redisStore>) => {
    const id = randomUUID();
    await store.claim({ id, token: 'a', fingerprint: 'f', leaseMs: 5_000, keepAfterLeaseMs: 60_000 });
    await store.claim({ id, token: 'b', fingerprint: 'f', leaseMs: 5_000 });
    await store.renew({ id, token: 'a', leaseMs: 5_000 });
    await store.complete({ id, token: 'a', response: response(), retentionMs: 60_000 });
    await store.get(id);
    await store.forget({ id, token: 'a' });
    await store.claim({ id, token: 'c', fingerprint: 'f', leaseMs: 5_000 });
    await store.release({ id, token: 'c' });
  };

  // "You connect the client and you close it. The store never connects, quits, or subscribes to the
  // client's events."
  it('never connects, quits or listens to an ioredis client', async () => {
    const lazy = new Redis(redisUrl(), { lazyConnect: true });
    try {
      redisStore({ client: lazy, prefix });
      expect(lazy.status).toBe('wait'); // not connected by the store
    } finally {
      lazy.disconnect();
    }
    const client = new Redis(redisUrl());
    try {
      await client.ping();
      const before = listeners(client);
      const store = redisStore({ client, prefix });
      await everyOperation(store);
      expect(listeners(client)).toEqual(before);
      expect(client.status).toBe('ready');
    } finally {
      await client.quit();
    }
  });

  it('never connects, quits or listens to a node-redis client', async () => {
    const unconnected = createClient({ url: redisUrl() });
    redisStore({ client: unconnected, prefix });
    expect(unconnected.isOpen).toBe(false);
    const client = await createClient({ url: redisUrl() }).connect();
    try {
      const before = listeners(client);
      await everyOperation(redisStore({ client, prefix }));
      expect(listeners(client)).toEqual(before);
      expect(client.isReady).toBe(true);
    } finally {
      await client.close();
    }
  });

  // "What each operation does": renew, complete, release, forget and get are one round trip each
  // (the claim's trips are pinned in packages/redis/test/redis.int.test.ts).
  it('renews, completes, releases, forgets and reads with one command each', async () => {
    const real = redisCommandRunner(admin);
    const sent: string[] = [];
    const runner: RedisCommandRunner = {
      send: (key, args) => {
        sent.push(String(args[0]));
        return real.send(key, args);
      },
    };
    const store = redisStore({ client: runner, prefix });
    await everyOperation(store); // caches every script on this server (EVALSHA after NOSCRIPT's EVAL)
    const id = randomUUID();
    await store.claim({ id, token: 'a', fingerprint: 'f', leaseMs: 5_000, keepAfterLeaseMs: 60_000 });
    const trips = async (work: () => Promise<unknown>) => {
      sent.length = 0;
      await work();
      return [...sent];
    };
    expect(await trips(() => store.renew({ id, token: 'a', leaseMs: 5_000 }))).toEqual(['EVALSHA']);
    // Was wrong on the page: its table gave `get` as one `GET`, one round trip, always. A record in
    // progress is read again with its PTTL, as a claim reads it, to tell a live lease from an
    // abandoned one: two round trips (the page now says so).
    expect(await trips(() => store.get(id))).toEqual(['GET', 'EVALSHA']);
    expect(row('### What each operation does', 'get')).toMatch(/\| 1, or 2 when the record is in progress +\|$/);
    expect(await trips(() => store.complete({ id, token: 'a', response: response(), retentionMs: 60_000 }))).toEqual([
      'EVALSHA',
    ]);
    expect(await trips(() => store.get(id))).toEqual(['GET']);
    expect(await trips(() => store.forget({ id, token: 'a' }))).toEqual(['EVALSHA']);
    await store.claim({ id, token: 'b', fingerprint: 'f', leaseMs: 5_000 });
    expect(await trips(() => store.release({ id, token: 'b' }))).toEqual(['EVALSHA']);
  });
});

describe.runIf(withPostgres)('PostgreSQL', () => {
  let pool: pg.Pool;
  const table = `audit_stores_${randomUUID().slice(0, 8)}`;
  beforeAll(async () => {
    pool = new pg.Pool({ connectionString: databaseUrl(), max: 4 });
    await migrate(pool, { table });
  });
  afterAll(async () => {
    // This run's tables only (each starts with its name): the database is shared with other runs.
    const { rows } = await pool.query<{ tablename: string }>(
      `SELECT tablename FROM pg_tables WHERE starts_with(tablename, $1)`,
      [table],
    );
    for (const { tablename } of rows) await pool.query(`DROP TABLE IF EXISTS "${tablename}"`);
    await pool.end();
  });

  // "You create the client and you close it. The store never connects or ends it."
  it('never connects, ends or listens to the pool or a client', async () => {
    const own = new pg.Pool({ connectionString: databaseUrl(), max: 2 });
    try {
      const before = listeners(own);
      const store = postgresStore({ client: own, table });
      expect(own.totalCount).toBe(0); // made, not connected
      const id = randomUUID();
      await store.claim({ id, token: 'a', fingerprint: 'f', leaseMs: 5_000, keepAfterLeaseMs: 60_000 });
      await store.complete({ id, token: 'a', response: response(), retentionMs: 60_000 });
      await store.get(id);
      await store.purgeExpired();
      expect(listeners(own)).toEqual(before);
      expect(own.ended).toBe(false);
      expect((await own.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    } finally {
      await own.end();
    }
  });

  describe('Schema and migration', () => {
    // "for a table name longer than 52 characters the index name is the table's first 43 characters,
    // `_`, 8 hex digits of a hash of the table name, then `_expires_at`."
    it('names the index <table>_expires_at up to 52 characters, and cuts a longer name as the page says', async () => {
      const fits = `${table}_`.padEnd(52, 'f');
      const long = `${table}_`.padEnd(53, 'l');
      for (const name of [fits, long]) await migrate(pool, { table: name });
      const index = async (name: string) =>
        (
          await pool.query<{ indexname: string }>(
            `SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexname NOT LIKE '%_pkey'`,
            [name],
          )
        ).rows.map((row) => row.indexname);
      expect(await index(fits)).toEqual([`${fits}_expires_at`]);
      const [cut] = await index(long);
      expect(cut).toMatch(new RegExp(`^${long.slice(0, 43)}_[0-9a-f]{8}_expires_at$`));
      expect(cut).toHaveLength(63);
      expect(cut).toBe(
        `${long.slice(0, 43)}_${createHash('sha256').update(long).digest('hex').slice(0, 8)}_expires_at`,
      );
    });

    // "A table that needs no change takes no lock at all."
    it('migrate() of a table that needs no change goes through while another session holds the table locked', async () => {
      const holder = new pg.Client({ connectionString: databaseUrl() });
      await holder.connect();
      try {
        await holder.query('BEGIN');
        await holder.query(`LOCK TABLE "${table}" IN ACCESS EXCLUSIVE MODE`);
        await expect(migrate(pool, { table, lockTimeout: '200ms', lockWait: '1s' })).resolves.toBeUndefined();
      } finally {
        await holder.query('ROLLBACK');
        await holder.end();
      }
    });
  });

  describe('What each operation does', () => {
    // The claim: "If it is live, nothing is inserted and the record is returned, so a replay or a 409
    // is a plain read: no row lock, no WAL, no commit to flush." A locked or written row gets a new
    // xmax (a lock) or a new ctid (a new version).
    it('a claim that finds a live record (a 409, then a replay) neither locks nor writes its row', async () => {
      const store = postgresStore({ client: pool, table });
      const id = randomUUID();
      const row = async () =>
        (await pool.query(`SELECT xmin::text, xmax::text, ctid::text FROM "${table}" WHERE id = $1`, [id])).rows[0];
      await store.claim({ id, token: 'a', fingerprint: 'f', leaseMs: 60_000, keepAfterLeaseMs: 60_000 });
      const claimed = await row();
      expect((await store.claim({ id, token: 'b', fingerprint: 'f', leaseMs: 60_000 })).claimed).toBe(false);
      expect(await row()).toEqual(claimed);
      await store.complete({ id, token: 'a', response: response(), retentionMs: 60_000 });
      const completed = await row();
      expect(completed).not.toEqual(claimed);
      expect((await store.claim({ id, token: 'c', fingerprint: 'f', leaseMs: 60_000 })).claimed).toBe(false);
      expect(await row()).toEqual(completed);
    });
  });

  describe('Failover', () => {
    // "pg takes one host per pool or client. It does not understand a connection string that lists
    // two, libpq's way (... throws `Invalid URL`; `host=a,b ...` fails to connect)."
    it('pg refuses a connection string with two hosts', async () => {
      const listed = new pg.Pool({ connectionString: 'postgres://a:5432,b:5432/db?target_session_attrs=read-write' });
      try {
        await expect((async () => listed.query('SELECT 1'))()).rejects.toThrow(/Invalid URL/);
      } finally {
        await listed.end();
      }
      const client = new pg.Client({
        connectionString: 'host=127.0.0.1,127.0.0.2 port=5432,5432 target_session_attrs=read-write',
        connectionTimeoutMillis: 2_000,
      });
      await expect(client.connect()).rejects.toThrow();
    });
  });
});
