// An application that sets pg's global type parsers (pg.types.setTypeParser: int8 as BigInt, bytea
// or jsonb as its own objects, timestamps as strings) changes what every query of the process reads
// back, the store's too. The store reads its own rows with its own parsers, so a replay is the
// stored answer byte for byte whatever the application chose; a transactional handler's own queries
// keep the application's parsers.
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { migrate, postgresStore } from '../src/index.js';
import { databaseUrl, postgresAvailable, testPool, uniqueTable } from './database.js';

// bool, bytea, int8, int4, text, json, varchar, timestamptz, jsonb: every type the store reads, and
// the ones applications most often parse their own way.
const oids = [16, 17, 20, 23, 25, 114, 1043, 1184, 3802] as const;

// What an application might install: every value comes back wrapped, so any read through it shows.
const installHostileParsers = () => {
  const saved = oids.map((oid) => [oid, pg.types.getTypeParser(oid, 'text')] as const);
  for (const oid of oids) pg.types.setTypeParser(oid, (value: string) => ({ appParsed: oid, value }));
  return () => {
    for (const [oid, parser] of saved) pg.types.setTypeParser(oid, parser as (value: string) => unknown);
  };
};

const body = new Uint8Array([0, 1, 2, 0x5c, 0x78, 255, 10, 13, 0x27]);
// A reason phrase of the handler's own too: the store reads it back as text, through its own parser.
const response = {
  status: 201,
  headers: { 'content-type': 'application/octet-stream', etag: '"v1"' },
  body,
  statusMessage: 'Created Fine',
};

describe.runIf(await postgresAvailable())('global pg type parsers', () => {
  let pool: pg.Pool;
  let client: pg.Client;
  let restore: (() => void) | undefined;
  const tables: string[] = [];
  beforeAll(async () => {
    pool = testPool();
    client = new pg.Client({ connectionString: databaseUrl });
    client.on('error', () => undefined);
    await client.connect();
  });
  afterEach(() => {
    restore?.();
    restore = undefined;
  });
  afterAll(async () => {
    for (const table of tables) await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await client.end();
    await pool.end();
  });

  for (const kind of ['pool', 'client'] as const) {
    it(`do not change what a ${kind} store reads: migrate, claim, replay byte for byte`, async () => {
      const table = uniqueTable(`parsers_${kind}`);
      tables.push(table);
      const db = kind === 'pool' ? pool : client;
      restore = installHostileParsers();
      await migrate(db, { table });
      // Twice: the second run reads an existing table's catalog, booleans included.
      await migrate(db, { table });
      const store = postgresStore({ client: db, table });
      expect(await store.claim({ id: 'k', token: 't1', fingerprint: 'fp', leaseMs: 60_000 })).toEqual({
        claimed: true,
      });
      expect(await store.claim({ id: 'k', token: 't2', fingerprint: 'fp', leaseMs: 60_000 })).toEqual({
        claimed: false,
        record: { state: 'in_progress', token: 't1', fingerprint: 'fp' },
      });
      expect(await store.complete({ id: 'k', token: 't1', response, retentionMs: 60_000 })).toBe(true);
      const record = await store.get('k');
      expect(record).toEqual({ state: 'completed', token: 't1', fingerprint: 'fp', response });
      const replayed = await store.claim({ id: 'k', token: 't3', fingerprint: 'fp', leaseMs: 60_000 });
      expect(replayed).toEqual({
        claimed: false,
        record: { state: 'completed', token: 't1', fingerprint: 'fp', response },
      });
      const stored = replayed.claimed ? undefined : replayed.record;
      expect(stored?.state === 'completed' && Buffer.from(stored.response.body).equals(Buffer.from(body))).toBe(true);
    });
  }

  // A setting of the connection that changes the wire format of what the store reads.
  for (const [label, config] of [["bytea_output = 'escape'", { options: '-c bytea_output=escape' }]] as const) {
    it(`do not change what the store reads on a pool with ${label}`, async () => {
      const table = uniqueTable('parsers_format');
      tables.push(table);
      const other = testPool(config);
      try {
        restore = installHostileParsers();
        await migrate(other, { table });
        await migrate(other, { table });
        const store = postgresStore({ client: other, table });
        await store.claim({ id: 'k', token: 't1', fingerprint: 'fp', leaseMs: 60_000 });
        expect(await store.complete({ id: 'k', token: 't1', response, retentionMs: 60_000 })).toBe(true);
        expect(await store.get('k')).toEqual({ state: 'completed', token: 't1', fingerprint: 'fp', response });
      } finally {
        await other.end();
      }
    });
  }

  it('refuse a pg client made with binary: true, which pg 8 reads back lossily', async () => {
    // pg decodes each binary field as UTF-8 text: a stored 201 read back as 239, a body's 0xff as U+FFFD.
    // `binary` is a pg option its types do not declare.
    const binary = { binary: true } as Record<string, unknown>;
    const binaryPool = testPool(binary as pg.PoolConfig);
    const binaryClient = new pg.Client({ connectionString: databaseUrl, ...binary } as pg.ClientConfig);
    try {
      expect(() => postgresStore({ client: binaryPool })).toThrow(/binary: true/);
      expect(() => postgresStore({ client: binaryClient })).toThrow(/binary: true/);
      await expect(migrate(binaryPool, { table: uniqueTable('binary') })).rejects.toThrow(/binary: true/);
    } finally {
      await binaryPool.end();
    }
  });

  it("leave a transactional handler's own queries to the application's parsers", async () => {
    const table = uniqueTable('parsers_tx');
    tables.push(table);
    await migrate(pool, { table });
    const store = postgresStore({ client: pool, table });
    await store.claim({ id: 'k', token: 't1', fingerprint: 'fp', leaseMs: 60_000 });
    restore = installHostileParsers();
    const result = await store.transaction({ id: 'k', token: 't1' }, async (tx) => {
      const { rows } = await tx.query<{ n: unknown }>('SELECT 7::int4 AS n');
      return { value: rows[0]?.n, response, retentionMs: 60_000 };
    });
    expect(result).toEqual({ committed: true, value: { appParsed: 23, value: '7' } });
    expect(await store.get('k')).toEqual({ state: 'completed', token: 't1', fingerprint: 'fp', response });
  });
});
