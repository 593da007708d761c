// Focused tests of @idem/postgres that every client flavour (PGlite, pg Pool, pg Client) must pass,
// beyond the shared describeStore() contract: migration, purge, transactional mode, SQL safety.
import { randomUUID } from 'node:crypto';
import {
  createIdempotency,
  type IdempotencyEvent,
  InvalidResponseError,
  recordId,
  type StoredResponse,
} from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  migrate,
  type PostgresClient,
  type PostgresStore,
  postgresStore,
  ResponseTooLargeError,
} from '../src/index.js';
import { freshTable, sql } from './database.js';

const response = (text: string, status = 201): StoredResponse => ({
  status,
  headers: { 'content-type': 'text/plain' },
  body: new TextEncoder().encode(text),
});

const freshId = () => recordId(`scope-${randomUUID()}`, 'POST /charges', randomUUID());

/** A client under test and how to let go of it. */
export interface Backend {
  client: PostgresClient;
  close(): Promise<void>;
}

export function describePostgresBehaviour(name: string, open: () => Promise<Backend>): void {
  describe(`@idem/postgres on ${name}`, () => {
    let backend: Backend;
    let client: PostgresClient;
    let table: string;
    let drop: () => Promise<void>;
    let store: PostgresStore;
    // The handler's own table, written inside transactions.
    let effects: string;

    const expire = (id: string) =>
      sql(client, `UPDATE "${table}" SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE id = $1`, [
        id,
      ]);
    // Moves the end of a record's lease or retention `ms` into the past.
    const endedAgo = (id: string, ms: number) =>
      sql(
        client,
        `UPDATE "${table}" SET expires_at = clock_timestamp() - $2::float8 * interval '1 millisecond' WHERE id = $1`,
        [id, ms],
      );
    const rowExists = async (id: string) =>
      (await sql(client, `SELECT 1 FROM "${table}" WHERE id = $1`, [id])).length === 1;
    const hour = 60 * 60 * 1000;
    const effectCount = async (marker: string) =>
      Number((await sql(client, `SELECT count(*)::int AS n FROM "${effects}" WHERE marker = $1`, [marker]))[0].n);

    beforeAll(async () => {
      backend = await open();
      client = backend.client;
      ({ table, drop } = await freshTable(client, 'behaviour'));
      effects = `${table}_effects`;
      await sql(client, `CREATE TABLE "${effects}" (marker text NOT NULL)`);
      store = postgresStore({ client, table });
    });

    afterAll(async () => {
      if (client) {
        await sql(client, `DROP TABLE IF EXISTS "${effects}"`);
        await drop();
      }
      await backend?.close();
    });

    describe('schema', () => {
      it('migrate() is idempotent, also when several run at once', async () => {
        await Promise.all([migrate(client, { table }), migrate(client, { table }), migrate(client, { table })]);
        const columns = await sql(
          client,
          `SELECT column_name, data_type FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position`,
          [table],
        );
        expect(columns.map((c) => `${c.column_name}:${c.data_type}`)).toEqual([
          'id:text',
          'state:text',
          'token:text',
          'fingerprint:text',
          'status:integer',
          'headers:jsonb',
          'body:bytea',
          'expires_at:timestamp with time zone',
        ]);
        const indexes = await sql(client, 'SELECT indexname FROM pg_indexes WHERE tablename = $1 ORDER BY indexname', [
          table,
        ]);
        expect(indexes.map((i) => i.indexname)).toEqual([`${table}_expires_at`, `${table}_pkey`]);
      });

      it('gives each table its own expires_at index, also under names too long for `<table>_expires_at`', async () => {
        // 63 characters each, the same first 60: PostgreSQL would cut both index names to the
        // table's own name, and CREATE INDEX IF NOT EXISTS would skip them.
        const stem = `${table}_long_`.padEnd(60, 'x');
        const names = [`${stem}aaa`, `${stem}bbb`];
        try {
          for (const name of names) await migrate(client, { table: name });
          for (const name of names) {
            const indexes = await sql(client, 'SELECT indexdef FROM pg_indexes WHERE tablename = $1', [name]);
            expect(
              indexes.filter((index) => String(index.indexdef).endsWith('(expires_at)')),
              name,
            ).toHaveLength(1);
          }
          // Running it again finds the index instead of adding a second one, whatever its name (an
          // older release named it by cutting the table name).
          const [index] = await sql(
            client,
            `SELECT indexname FROM pg_indexes WHERE tablename = $1 AND indexname NOT LIKE '%_pkey'`,
            [names[0]],
          );
          await sql(client, `ALTER INDEX "${index.indexname}" RENAME TO "${table}_older_name"`);
          await migrate(client, { table: names[0] });
          expect(await sql(client, 'SELECT indexname FROM pg_indexes WHERE tablename = $1', [names[0]])).toHaveLength(
            2,
          );
          // A hash index serves no range purge (`expires_at <= now`): it does not count, the b-tree is built.
          await sql(client, `DROP INDEX "${table}_older_name"`);
          await sql(client, `CREATE INDEX "${table}_hash" ON "${names[0]}" USING hash (expires_at)`);
          await migrate(client, { table: names[0] });
          const defs = await sql(client, 'SELECT indexdef FROM pg_indexes WHERE tablename = $1', [names[0]]);
          expect(defs.filter((index) => /USING btree \(expires_at\)$/.test(String(index.indexdef)))).toHaveLength(1);
        } finally {
          for (const name of names) await sql(client, `DROP TABLE IF EXISTS "${name}"`);
        }
      });

      it('a partial index on expires_at does not count either: migrate() still builds the plain b-tree', async () => {
        const partial = `${table}_partial`;
        try {
          await migrate(client, { table: partial });
          // The b-tree migrate() built goes; what is left is one that covers no row (`WHERE false`),
          // a plain b-tree on expires_at in every other respect.
          await sql(client, `DROP INDEX "${partial}_expires_at"`);
          await sql(client, `CREATE INDEX "${partial}_never" ON "${partial}" (expires_at) WHERE false`);
          await migrate(client, { table: partial });
          const defs = (await sql(client, 'SELECT indexdef FROM pg_indexes WHERE tablename = $1', [partial])).map(
            (index) => String(index.indexdef),
          );
          expect(defs.filter((def) => /USING btree \(expires_at\)$/.test(def))).toHaveLength(1);
          expect(defs.filter((def) => /USING btree \(expires_at\) WHERE false$/.test(def))).toHaveLength(1);
          // Now the plain one is there, a second run finds it and builds nothing more.
          await migrate(client, { table: partial });
          expect(await sql(client, 'SELECT indexname FROM pg_indexes WHERE tablename = $1', [partial])).toHaveLength(3);
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${partial}"`);
        }
      });

      it('runs no DDL on construction: a store on a missing table fails its first call and creates nothing', async () => {
        const missing = `${table}_missing`;
        const lonely = postgresStore({ client, table: missing });
        const failure = await lonely.get(freshId()).then(
          () => undefined,
          (error: unknown) => error,
        );
        // A missing table is a deployment mistake (42P01), not an outage.
        expect((failure as { code?: string }).code).toBe('42P01');
        expect((failure as Error).name).not.toBe('StoreUnavailableError');
        expect(await sql(client, 'SELECT to_regclass($1) AS t', [missing])).toEqual([{ t: null }]);
      });

      it('refuses table names that are not plain identifiers, before touching the database', () => {
        for (const bad of ['x; DROP TABLE y', 'a"b', 'a.b.c', '', '1abc', 'x'.repeat(64), 'sp ace']) {
          expect(() => postgresStore({ client, table: bad })).toThrow(TypeError);
        }
        expect(() => postgresStore({ client: {} as PostgresClient })).toThrow(TypeError);
      });
    });

    describe('claim', () => {
      it('takes over an expired completed record and drops its stored response', async () => {
        const id = freshId();
        await store.claim({ id, token: 'a', fingerprint: 'fp-a', leaseMs: 5_000 });
        await store.complete({ id, token: 'a', response: response('old'), retentionMs: 60_000 });
        await expire(id);
        expect(await store.claim({ id, token: 'b', fingerprint: 'fp-b', leaseMs: 5_000 })).toEqual({ claimed: true });
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'b', fingerprint: 'fp-b' });
        const [row] = await sql(client, `SELECT status, headers, body FROM "${table}" WHERE id = $1`, [id]);
        expect(row).toEqual({ status: null, headers: null, body: null });
      });

      it('does not renew, complete or release a lease that has run out', async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await expire(id);
        expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(false);
        expect(await store.complete({ id, token: 't', response: response('x'), retentionMs: 60_000 })).toBe(false);
        expect(await store.release({ id, token: 't' })).toBe(false);
        expect(await store.get(id)).toBeUndefined();
      });

      it('rejects misuse with TypeError and sends nothing', async () => {
        await expect(store.claim({ id: '', token: 't', fingerprint: '', leaseMs: 1_000 })).rejects.toThrow(TypeError);
        await expect(store.claim({ id: freshId(), token: 't', fingerprint: '', leaseMs: 0 })).rejects.toThrow(
          TypeError,
        );
        // (The response's shape is the engine's to check, before any store sees it.)
        await expect(
          store.complete({ id: freshId(), token: 't', response: response('x'), retentionMs: 0 }),
        ).rejects.toThrow(TypeError);
        await expect(store.purgeExpired({ batchSize: 0 })).rejects.toThrow(TypeError);
      });
    });

    // Over the cap, exactly the cap and through the engine are describeStore()'s (harness.makeCapped);
    // here is what only this store has: its default, its transactions and its ceiling.
    describe('size cap (maxResponseBytes)', () => {
      let capped: PostgresStore;
      beforeAll(() => {
        capped = postgresStore({ client, table, maxResponseBytes: 1_000 });
      });
      // The helper's headers, {"content-type":"text/plain"}, and the framing come to 44 bytes.
      const sized = (bytes: number): StoredResponse => ({
        status: 200,
        headers: { 'content-type': 'text/plain' },
        body: new Uint8Array(bytes - 44).fill(7),
      });

      it('defaults to 4 MiB, as the Redis store', async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const error = await store
          .complete({ id, token: 't', response: sized(4 * 1024 * 1024 + 1), retentionMs: 60_000 })
          .catch((e: unknown) => e);
        expect(error).toMatchObject({ code: 'response_too_large', limit: 4 * 1024 * 1024 });
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
      });

      it("in a transaction, rolls the handler's writes back with the oversized outcome", async () => {
        const id = freshId();
        const marker = randomUUID();
        await capped.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const error = await capped
          .transaction({ id, token: 't' }, async (tx) => {
            await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
            return { value: undefined, response: sized(1_001), retentionMs: 60_000 };
          })
          .catch((e: unknown) => e);
        expect(error).toBeInstanceOf(ResponseTooLargeError);
        expect(await effectCount(marker)).toBe(0);
        expect((await capped.get(id))?.state).toBe('in_progress');
      });

      it('refuses a limit that is not an integer from 1 to 256 MiB less 64 KiB, at construction', () => {
        for (const bad of [0, -1, 1.5, Number.NaN, '1000', 256 * 1024 * 1024 - 64 * 1024 + 1]) {
          expect(() => postgresStore({ client, table, maxResponseBytes: bad as number })).toThrow(TypeError);
        }
        expect(() => postgresStore({ client, table, maxResponseBytes: 256 * 1024 * 1024 - 64 * 1024 })).not.toThrow();
      });
    });

    describe('purgeExpired', () => {
      it('deletes at most batchSize expired records per call and never a live one', async () => {
        const marker = randomUUID();
        const expired = Array.from({ length: 25 }, (_, i) => `purge-${marker}-dead-${i}`);
        const live = Array.from({ length: 5 }, (_, i) => `purge-${marker}-live-${i}`);
        for (const id of [...expired, ...live]) await store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 });
        for (const id of expired.slice(0, 12))
          await store.complete({ id, token: 't', response: response('r'), retentionMs: 60_000 });
        // Other files' records are not in this table; earlier tests of this file left a few expired ones.
        await sql(client, `DELETE FROM "${table}" WHERE id NOT LIKE $1`, [`purge-${marker}-%`]);
        // The completed ones' retention just ended; the others' lease ended past the grace (one hour).
        for (const id of expired.slice(0, 12)) await expire(id);
        for (const id of expired.slice(12)) await endedAgo(id, hour + 1_000);
        expect(await store.purgeExpired({ batchSize: 10 })).toBe(10);
        expect(await store.purgeExpired({ batchSize: 10 })).toBe(10);
        expect(await store.purgeExpired({ batchSize: 10 })).toBe(5);
        expect(await store.purgeExpired({ batchSize: 10 })).toBe(0);
        const left = await sql(client, `SELECT id FROM "${table}" ORDER BY id`);
        expect(left.map((row) => row.id)).toEqual([...live].sort());
      });

      it('keeps a record in progress for an hour after its lease ended, so a late transactional completion commits', async () => {
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        // The lease ran out while the handler worked, nobody took the key over, and a purge ran.
        // (On one connection, PGlite or a pg Client, the purge cannot run during the transaction;
        // the completion's compare-and-set is the same either way. pg.int.test.ts runs it during.)
        await expire(id);
        await store.purgeExpired();
        await endedAgo(id, hour - 60_000);
        await store.purgeExpired();
        expect(await rowExists(id)).toBe(true);
        const result = await store.transaction({ id, token: 't' }, async (tx) => {
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
          return { value: 'late', response: response('late'), retentionMs: 60_000 };
        });
        expect(result).toEqual({ committed: true, value: 'late' });
        expect(await effectCount(marker)).toBe(1);
        expect((await store.get(id))?.state).toBe('completed');
      });

      it('purges a record in progress once the grace is over, and a completed one when its retention ends', async () => {
        const stale = freshId();
        const recent = freshId();
        const completed = freshId();
        for (const id of [stale, recent, completed])
          await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await store.complete({ id: completed, token: 't', response: response('r'), retentionMs: 60_000 });
        await endedAgo(stale, hour + 1_000);
        await endedAgo(recent, 1);
        await endedAgo(completed, 1);
        await store.purgeExpired();
        expect(await rowExists(stale)).toBe(false);
        expect(await rowExists(completed)).toBe(false);
        expect(await rowExists(recent)).toBe(true);
      });

      it('takes the grace as inProgressGraceMs, 0 included, and refuses one that is no duration', async () => {
        const older = freshId();
        const newer = freshId();
        for (const id of [older, newer]) await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await endedAgo(older, 2_000);
        await endedAgo(newer, 1);
        await store.purgeExpired({ inProgressGraceMs: 1_000 });
        expect(await rowExists(older)).toBe(false);
        expect(await rowExists(newer)).toBe(true);
        await store.purgeExpired({ inProgressGraceMs: 0 });
        expect(await rowExists(newer)).toBe(false);
        for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY, '1000', null]) {
          await expect(store.purgeExpired({ inProgressGraceMs: bad as number })).rejects.toThrow(TypeError);
        }
      });
    });

    describe('transaction', () => {
      it("commits the handler's writes and the stored response together", async () => {
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
        const result = await store.transaction({ id, token: 't' }, async (tx) => {
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
          const seen = await tx.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${effects}" WHERE marker = $1`, [
            marker,
          ]);
          return { value: seen.rows[0]?.n, response: response('done'), retentionMs: 60_000 };
        });
        expect(result).toEqual({ committed: true, value: 1 });
        expect(await effectCount(marker)).toBe(1);
        const record = await store.get(id);
        expect(record?.state).toBe('completed');
        if (record?.state === 'completed') expect(new TextDecoder().decode(record.response.body)).toBe('done');
      });

      it('deletes the record in the same transaction when the response is undefined', async () => {
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const result = await store.transaction({ id, token: 't' }, async (tx) => {
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
          return { value: 'released', response: undefined, retentionMs: 60_000 };
        });
        expect(result).toEqual({ committed: true, value: 'released' });
        expect(await store.get(id)).toBeUndefined();
        expect(await effectCount(marker)).toBe(1);
      });

      it('rolls everything back and rethrows the very error when the handler throws', async () => {
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const thrown = Object.assign(new Error('card declined'), { code: 'ECONNREFUSED' });
        const failure = await store
          .transaction({ id, token: 't' }, async (tx) => {
            await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
            throw thrown;
          })
          .catch((error: unknown) => error);
        // Even an error that looks like an outage is the handler's own and comes back untouched.
        expect(failure).toBe(thrown);
        expect(await effectCount(marker)).toBe(0);
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
        // The connection is usable again afterwards.
        expect(await store.release({ id, token: 't' })).toBe(true);
      });

      it("passes the handler's SQL errors through unchanged and rolls back", async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const failure = await store
          .transaction({ id, token: 't' }, async (tx) => {
            await tx.query('SELECT * FROM idem_no_such_table_anywhere');
            return { value: 1, response: response('never'), retentionMs: 60_000 };
          })
          .catch((error: unknown) => error);
        expect((failure as { code?: string }).code).toBe('42P01');
        expect((await store.get(id))?.state).toBe('in_progress');
      });

      it('commits nothing when the token is no longer current, and says so', async () => {
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 'old', fingerprint: '', leaseMs: 5_000 });
        await expire(id);
        await store.claim({ id, token: 'new', fingerprint: '', leaseMs: 5_000 });
        const result = await store.transaction({ id, token: 'old' }, async (tx) => {
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
          return { value: 'late', response: response('late'), retentionMs: 60_000 };
        });
        expect(result).toEqual({ committed: false });
        expect(await effectCount(marker)).toBe(0);
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'new', fingerprint: '' });
      });

      it('completes a lease that ran out during the handler when nobody took it over', async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await expire(id);
        const result = await store.transaction({ id, token: 't' }, async () => ({
          value: 'ok',
          response: response('kept'),
          retentionMs: 60_000,
        }));
        expect(result).toEqual({ committed: true, value: 'ok' });
        expect((await store.get(id))?.state).toBe('completed');
      });

      it('refuses queries through a transaction handle kept past its transaction', async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        let kept: { query(text: string): Promise<unknown> } | undefined;
        await store.transaction({ id, token: 't' }, async (tx) => {
          kept = tx;
          return { value: undefined, response: response('x'), retentionMs: 60_000 };
        });
        await expect(kept?.query('SELECT 1')).rejects.toThrow(/transaction is over/);
      });

      it('runs through the engine: one execution, the write and the replay agree', async () => {
        const engine = createIdempotency({ store, heartbeat: false });
        const key = randomUUID();
        const marker = randomUUID();
        const request = { key, scope: 'user:1', operation: 'POST /orders', fingerprint: 'fp' };
        const first = await engine.begin(request);
        expect(first.kind).toBe('execute');
        if (first.kind !== 'execute') return;
        const outcome = await engine.transaction(
          first.lease,
          async (tx: { query(text: string, params: unknown[]): Promise<unknown> }) => {
            await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
            return { value: 'order-1', response: response('{"order":1}') };
          },
        );
        expect(outcome).toEqual({ committed: true, value: 'order-1', stored: true });
        const again = await engine.begin(request);
        expect(again.kind).toBe('replay');
        if (again.kind === 'replay') expect(new TextDecoder().decode(again.response.body)).toBe('{"order":1}');
        expect(await effectCount(marker)).toBe(1);
      });

      it("through the engine, a response the engine refuses rolls the handler's writes back and frees the key", async () => {
        const events: IdempotencyEvent[] = [];
        const engine = createIdempotency({ store, heartbeat: false, onEvent: (event) => events.push(event) });
        const marker = randomUUID();
        const request = { key: randomUUID(), scope: 'user:1', operation: 'POST /orders' };
        const first = await engine.begin(request);
        expect(first.kind).toBe('execute');
        if (first.kind !== 'execute') return;
        const outcome = await engine.transaction(
          first.lease,
          async (tx: { query(text: string, params: unknown[]): Promise<unknown> }) => {
            await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
            // A NUL in a header: jsonb would refuse it, and no replay could write it.
            return { value: 'order-1', response: { ...response('{}'), headers: { etag: 'a\u0000b' } } };
          },
        );
        expect(outcome).toMatchObject({ committed: false, reason: 'store-error' });
        expect(!outcome.committed && outcome.error).toBeInstanceOf(InvalidResponseError);
        expect(events.some((e) => e.type === 'store-error' && e.phase === 'transaction')).toBe(true);
        expect(await effectCount(marker)).toBe(0);
        expect(await store.get(first.lease.id)).toBeUndefined();
        expect((await engine.begin(request)).kind).toBe('execute');
      });
    });
  });
}
