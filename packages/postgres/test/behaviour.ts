// Focused tests of @idem/postgres that every client flavour (PGlite, pg Pool, pg Client) must pass,
// beyond the shared describeStore() contract: migration, purge, transactional mode, SQL safety.
import { randomUUID } from 'node:crypto';
import {
  createIdempotency,
  type IdempotencyEvent,
  InvalidResponseError,
  isTransactionAbortedError,
  recordId,
  type StoredResponse,
  StoreUnavailableError,
  TransactionAbortedError,
} from '@idem/core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  migrate,
  type PostgresClient,
  type PostgresStore,
  type PostgresTransaction,
  postgresStore,
  ResponseTooLargeError,
} from '../src/index.js';
import { postgresStoreOnClock } from '../src/postgres-store.js';
import { createSqlClient } from '../src/sql-client.js';
import { statusMessageColumn } from '../src/status-message-column.js';
import { parseTableName } from '../src/table-name.js';
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
    // A handler's table whose unique key is checked only at COMMIT.
    let deferred: string;

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
      deferred = `${table}_slots`;
      await sql(
        client,
        `CREATE TABLE "${deferred}" (slot text NOT NULL, CONSTRAINT "${deferred}_slot" UNIQUE (slot) DEFERRABLE INITIALLY DEFERRED)`,
      );
      store = postgresStore({ client, table });
    });

    afterAll(async () => {
      if (client) {
        await sql(client, `DROP TABLE IF EXISTS "${effects}"`);
        await sql(client, `DROP TABLE IF EXISTS "${deferred}"`);
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
          'lease_until:timestamp with time zone',
          'status_message:text',
        ]);
        const indexes = await sql(client, 'SELECT indexname FROM pg_indexes WHERE tablename = $1 ORDER BY indexname', [
          table,
        ]);
        expect(indexes.map((i) => i.indexname)).toEqual([`${table}_expires_at`, `${table}_pkey`]);
      });

      it('a table not migrated for this version, or none at all, fails with an error that says to run migrate()', async () => {
        const older = `${table}_unmigrated`;
        try {
          await sql(
            client,
            `CREATE TABLE "${older}" (id text PRIMARY KEY, state text NOT NULL, token text NOT NULL,
               fingerprint text NOT NULL, status integer, headers jsonb, body bytea, expires_at timestamptz NOT NULL)`,
          );
          for (const name of [older, `${table}_never_created`]) {
            const unmigrated = postgresStore({ client, table: name });
            const claim = unmigrated.claim({
              id: 'x',
              token: 't',
              fingerprint: '',
              leaseMs: 1_000,
              keepAfterLeaseMs: 1_000,
            });
            // A deployment mistake, not an outage: its SQLSTATE kept, no StoreUnavailableError.
            const failure = await claim.then(
              () => undefined,
              (error: unknown) => error as Error & { code?: string },
            );
            expect(failure?.message).toMatch(/run migrate\(\)/);
            expect(failure?.code).toBe(name === older ? '42703' : '42P01');
            expect(failure).not.toBeInstanceOf(StoreUnavailableError);
            await expect(unmigrated.get('x')).rejects.toThrow(/run migrate\(\)/);
          }
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${older}"`);
        }
      });

      // Was a defect: migrate() looked only for the table's name. A table of that name without a
      // unique key on `id` (made by another tool, or by hand without PRIMARY KEY) passed it, and then
      // every claim failed (42P10: ON CONFLICT (id) needs a unique index on id alone), so every
      // request was a 503 after a deploy that reported the table ready. It is refused at migrate() now.
      it('migrate() refuses a table of that name that has no unique key on id alone', async () => {
        const keyless = `${table}_keyless`;
        try {
          for (const key of ['', ', UNIQUE (id, token)', ', UNIQUE (id) DEFERRABLE INITIALLY DEFERRED']) {
            await sql(client, `DROP TABLE IF EXISTS "${keyless}"`);
            await sql(
              client,
              `CREATE TABLE "${keyless}" (id text NOT NULL, state text NOT NULL, token text NOT NULL,
                 fingerprint text NOT NULL, status integer, headers jsonb, body bytea,
                 expires_at timestamptz NOT NULL, lease_until timestamptz${key})`,
            );
            await expect(migrate(client, { table: keyless }), key).rejects.toThrow(/unique key on id/);
          }
          // A unique index of its own on id will do, whatever its name.
          await sql(client, `DROP TABLE "${keyless}"`);
          await sql(
            client,
            `CREATE TABLE "${keyless}" (id text NOT NULL, state text NOT NULL, token text NOT NULL,
               fingerprint text NOT NULL, status integer, headers jsonb, body bytea,
               expires_at timestamptz NOT NULL, lease_until timestamptz)`,
          );
          await sql(client, `CREATE UNIQUE INDEX "${keyless}_by_id" ON "${keyless}" (id)`);
          await migrate(client, { table: keyless });
          const keyed = postgresStore({ client, table: keyless });
          expect(await keyed.claim({ id: 'x', token: 't', fingerprint: '', leaseMs: 1_000 })).toEqual({
            claimed: true,
          });
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${keyless}"`);
        }
      });

      // Was a defect: migrate() checked a same-named table's key but not its columns' types. `body`
      // as text stored a body as its hex text and replayed other bytes; `expires_at` as text failed
      // every claim at run time (no text > timestamptz), a 503 after a deploy that reported the table
      // ready. A column of another type, or missing, is refused at migrate() now, by name.
      it('migrate() refuses a table of that name whose columns are missing or of another type', async () => {
        const typed = `${table}_typed`;
        const columns: Record<string, string> = {
          id: 'text PRIMARY KEY',
          state: 'text NOT NULL',
          token: 'text NOT NULL',
          fingerprint: 'text NOT NULL',
          status: 'integer',
          headers: 'jsonb',
          body: 'bytea',
          expires_at: 'timestamptz NOT NULL',
          lease_until: 'timestamptz',
        };
        const create = async (changed: Record<string, string | undefined>) => {
          await sql(client, `DROP TABLE IF EXISTS "${typed}"`);
          const all = { ...columns, ...changed };
          const list = Object.entries(all)
            .filter(([, type]) => type !== undefined)
            .map(([name, type]) => `${name} ${type}`);
          await sql(client, `CREATE TABLE "${typed}" (${list.join(', ')})`);
        };
        try {
          for (const [column, type, expected] of [
            ['body', 'text', 'bytea'],
            ['expires_at', 'text NOT NULL', 'timestamp with time zone'],
            ['expires_at', 'timestamp NOT NULL', 'timestamp with time zone'],
            ['lease_until', 'text', 'timestamp with time zone'],
            ['headers', 'text', 'jsonb'],
            ['status', 'bigint', 'integer'],
            ['token', 'bytea NOT NULL', 'text'],
            // Shorter than a fingerprint (64 hex digits): every completion would fail at run time.
            ['fingerprint', 'varchar(63) NOT NULL', 'at least 64'],
            ['status_message', 'integer', 'text'],
            // A reason phrase has no length limit: any varchar(n) would refuse a longer one at completion.
            ['status_message', 'varchar(255)', 'make it text'],
          ] as const) {
            await create({ [column]: type });
            const failure = await migrate(client, { table: typed }).catch((error: unknown) => error);
            expect(failure, `${column} ${type}`).toBeInstanceOf(Error);
            const message = (failure as Error).message;
            expect(message, `${column} ${type}`).toContain(`column ${column} `);
            expect(message, `${column} ${type}`).toContain(expected);
          }
          await create({ fingerprint: undefined });
          await expect(migrate(client, { table: typed })).rejects.toThrow(/has no column fingerprint/);
          // The types as schema.sql makes them pass, and so does varchar for a text column, with a
          // length of at least what the store writes there (a hand-made varchar(255), say).
          await create({
            token: 'varchar NOT NULL',
            id: 'varchar(255) PRIMARY KEY',
            fingerprint: 'varchar(64) NOT NULL',
            status_message: 'varchar',
          });
          await migrate(client, { table: typed });
          const store_ = postgresStore({ client, table: typed });
          expect(await store_.claim({ id: 'x', token: 't', fingerprint: '', leaseMs: 1_000 })).toEqual({
            claimed: true,
          });
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${typed}"`);
        }
      });

      // Was a defect: migrate() checked the columns' types but not whether they may be NULL. A claim
      // inserts a row with no status, headers, body (nor lease_until for a claim without a keep, nor
      // status_message), and writes nothing to a column it does not know: a hand-made table where one
      // of those is NOT NULL without a default passed migrate() and failed every claim (23502).
      it('migrate() refuses a table of that name with a NOT NULL column the store leaves empty', async () => {
        const strict = `${table}_strict`;
        const base =
          'id text PRIMARY KEY, state text NOT NULL, token text NOT NULL, fingerprint text NOT NULL, expires_at timestamptz NOT NULL';
        const optional: Record<string, string> = {
          status: 'integer',
          headers: 'jsonb',
          body: 'bytea',
          lease_until: 'timestamptz',
          status_message: 'text',
        };
        const create = async (extra: string) => {
          await sql(client, `DROP TABLE IF EXISTS "${strict}"`);
          await sql(client, `CREATE TABLE "${strict}" (${base}, ${extra})`);
        };
        const all = (changed: Record<string, string>) =>
          Object.entries({ ...optional, ...changed })
            .map(([name, type]) => `${name} ${type}`)
            .join(', ');
        try {
          for (const column of Object.keys(optional)) {
            await create(all({ [column]: `${optional[column]} NOT NULL` }));
            await expect(migrate(client, { table: strict }), column).rejects.toThrow(
              new RegExp(`column ${column} is NOT NULL`),
            );
          }
          await create(all({ tenant: 'text NOT NULL' }));
          await expect(migrate(client, { table: strict })).rejects.toThrow(/column tenant is NOT NULL/);
          // A column of the application's own with a default is fine: the claim's INSERT fills it.
          await create(all({ tenant: "text NOT NULL DEFAULT 'main'" }));
          await migrate(client, { table: strict });
          expect(
            await postgresStore({ client, table: strict }).claim({
              id: 'x',
              token: 't',
              fingerprint: '',
              leaseMs: 1_000,
            }),
          ).toEqual({ claimed: true });
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${strict}"`);
        }
      });

      it('migrate() adds lease_until and status_message to a table of an older version, whose rows keep working', async () => {
        const older = `${table}_older`;
        try {
          // The table as versions before abandoned records made it, with a claim and a completed
          // record one of them wrote.
          await sql(
            client,
            `CREATE TABLE "${older}" (id text PRIMARY KEY, state text NOT NULL CHECK (state IN ('in_progress', 'completed')),
               token text NOT NULL, fingerprint text NOT NULL, status integer, headers jsonb, body bytea,
               expires_at timestamptz NOT NULL)`,
          );
          await sql(client, `CREATE INDEX "${older}_expires_at" ON "${older}" (expires_at)`);
          await sql(
            client,
            `INSERT INTO "${older}" (id, state, token, fingerprint, status, headers, body, expires_at) VALUES
               ('claimed', 'in_progress', 'old', 'fp', NULL, NULL, NULL, clock_timestamp() + interval '1 hour'),
               ('done', 'completed', 'old', 'fp', 201, '{}', '\\x01', clock_timestamp() + interval '1 hour')`,
          );
          await Promise.all([migrate(client, { table: older }), migrate(client, { table: older })]);
          const columns = await sql(
            client,
            `SELECT column_name FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position`,
            [older],
          );
          expect(columns.map((c) => c.column_name).slice(-2)).toEqual(['lease_until', 'status_message']);
          const upgraded = postgresStore({ client, table: older });
          expect(await upgraded.get('claimed')).toEqual({ state: 'in_progress', token: 'old', fingerprint: 'fp' });
          // Written without a phrase: it replays the status's default one.
          expect(await upgraded.get('done')).toEqual({
            state: 'completed',
            token: 'old',
            fingerprint: 'fp',
            response: { status: 201, headers: {}, body: new Uint8Array([1]) },
          });
          // The older claim renews and completes as ever, and a new claim is kept after its lease.
          expect(await upgraded.renew({ id: 'claimed', token: 'old', leaseMs: 5_000 })).toBe(true);
          expect(await upgraded.get('claimed')).toEqual({ state: 'in_progress', token: 'old', fingerprint: 'fp' });
          const outcome = { status: 200, headers: {}, body: new Uint8Array([2]) };
          expect(await upgraded.complete({ id: 'claimed', token: 'old', response: outcome, retentionMs: 60_000 })).toBe(
            true,
          );
          await upgraded.claim({ id: 'new', token: 't', fingerprint: 'fp', leaseMs: 5_000, keepAfterLeaseMs: 60_000 });
          await sql(
            client,
            `UPDATE "${older}" SET lease_until = clock_timestamp() - interval '1 millisecond' WHERE id = 'new'`,
          );
          expect((await upgraded.get('new'))?.state).toBe('abandoned');
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${older}"`);
        }
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

      it('refuses a misspelt option instead of using its default (a table name ignored, a wrong table)', async () => {
        expect(() => postgresStore({ client, tableName: 'other' } as never)).toThrow(
          'postgresStore: unknown option "tableName"',
        );
        await expect(store.purgeExpired({ batchsize: 5 } as never)).rejects.toThrow(
          'purgeExpired: unknown option "batchsize" (did you mean "batchSize"?)',
        );
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

      it('does not renew, complete, release or forget a lease that has run out', async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await expire(id);
        expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(false);
        expect(await store.complete({ id, token: 't', response: response('x'), retentionMs: 60_000 })).toBe(false);
        expect(await store.release({ id, token: 't' })).toBe(false);
        expect(await store.forget({ id, token: 't' })).toBe(false);
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

      it('refuses malformed arguments of every operation with TypeError, before any SQL', async () => {
        // The engine never sends these; a direct caller that does gets the misuse error, not a pg error
        // (a NULL fingerprint is a NOT NULL violation, an infinite lease an interval out of range) or,
        // worse, an answer: an empty token would match no row and read as "not the current holder".
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
        const misuses: Array<[string, () => Promise<unknown>]> = [
          [
            'claim, id not a string',
            () => store.claim({ id: 42 as unknown as string, token: 't', fingerprint: '', leaseMs: 1_000 }),
          ],
          ['claim, empty token', () => store.claim({ id: freshId(), token: '', fingerprint: '', leaseMs: 1_000 })],
          [
            'claim, no fingerprint',
            () =>
              store.claim({ id: freshId(), token: 't', fingerprint: undefined as unknown as string, leaseMs: 1_000 }),
          ],
          ['claim, NaN lease', () => store.claim({ id: freshId(), token: 't', fingerprint: '', leaseMs: Number.NaN })],
          [
            'claim, infinite lease',
            () => store.claim({ id: freshId(), token: 't', fingerprint: '', leaseMs: Number.POSITIVE_INFINITY }),
          ],
          ['renew, zero lease', () => store.renew({ id, token: 't', leaseMs: 0 })],
          ['release, empty token', () => store.release({ id, token: '' })],
          ['forget, empty token', () => store.forget({ id, token: '' })],
          ['forget, empty id', () => store.forget({ id: '', token: 't' })],
          ['get, empty id', () => store.get('')],
          ['purge, fractional batch', () => store.purgeExpired({ batchSize: 1.5 })],
          // Was a defect: finite but past what PostgreSQL's timestamps and bigint hold, these got
          // pg's "interval out of range" (22008) or "out of range for type bigint" (22003).
          [
            'claim, lease of 300,000 years',
            () => store.claim({ id: freshId(), token: 't', fingerprint: '', leaseMs: 1e16 }),
          ],
          [
            'claim, keep of 300,000 years',
            () => store.claim({ id: freshId(), token: 't', fingerprint: '', leaseMs: 1_000, keepAfterLeaseMs: 1e16 }),
          ],
          ['renew, lease of 300,000 years', () => store.renew({ id, token: 't', leaseMs: 1e16 })],
          [
            'complete, retention of 300,000 years',
            () => store.complete({ id, token: 't', response: response('x'), retentionMs: 1e16 }),
          ],
          ['purge, grace of 300,000 years', () => store.purgeExpired({ inProgressGraceMs: 1e16 })],
          ['purge, batch past bigint', () => store.purgeExpired({ batchSize: 1e20 })],
        ];
        for (const [what, call] of misuses) await expect(call(), what).rejects.toThrow(TypeError);
        // 2^60 is a positive integer: the refusal says which kind it must be.
        await expect(store.purgeExpired({ batchSize: 2 ** 60 })).rejects.toThrow(
          `batchSize must be a positive safe integer (at most ${Number.MAX_SAFE_INTEGER})`,
        );
        // The renewal with a zero lease did not end the lease.
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: 'fp' });
      });

      it("hands back a body that owns its bytes, not a view into the driver's buffer", async () => {
        // pg decodes a small bytea into a slice of Node's shared Buffer pool: a caller that passes
        // `body.buffer` on (a Response, a worker) would send other requests' bytes along.
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await store.complete({ id, token: 't', response: response('owned'), retentionMs: 60_000 });
        for (const read of [
          () => store.get(id),
          async () => {
            const again = await store.claim({ id, token: 'u', fingerprint: '', leaseMs: 5_000 });
            return again.claimed ? undefined : again.record;
          },
        ]) {
          const record = await read();
          expect(record?.state).toBe('completed');
          if (record?.state !== 'completed') return;
          const { body } = record.response;
          expect([body.byteOffset, body.buffer.byteLength]).toEqual([0, body.byteLength]);
          expect(new TextDecoder().decode(new Uint8Array(body.buffer))).toBe('owned');
        }
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
        // Declared, so the HTTP layer knows in advance what the store would refuse.
        expect([store.maxResponseBytes, capped.maxResponseBytes]).toEqual([4 * 1024 * 1024, 1_000]);
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

      it('never purges a completed record whose retention is still running, even with no grace', async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await store.complete({ id, token: 't', response: response('kept'), retentionMs: 60_000 });
        await store.purgeExpired({ inProgressGraceMs: 0 });
        expect((await store.get(id))?.state).toBe('completed');
      });

      it('deletes 1000 rows a call by default, and the oldest first', async () => {
        // A table of its own: the count and the order must not depend on what other tests left.
        const own = `${table}_purge`;
        await migrate(client, { table: own });
        try {
          const purging = postgresStore({ client, table: own });
          // Inserted newest first, so the table's physical order is the reverse of the expiry order.
          await sql(
            client,
            `INSERT INTO "${own}" (id, state, token, fingerprint, status, headers, body, expires_at)
             SELECT 'r' || g, 'completed', 't', '', 200, '{}', '\\x', clock_timestamp() - g * interval '1 second'
               FROM generate_series(1, 1003) AS g`,
          );
          expect(await purging.purgeExpired()).toBe(1000);
          const left = await sql(client, `SELECT id FROM "${own}" ORDER BY expires_at DESC`);
          expect(left.map((row) => row.id)).toEqual(['r1', 'r2', 'r3']);
          expect(await purging.purgeExpired({ batchSize: 1 })).toBe(1);
          expect((await sql(client, `SELECT id FROM "${own}" ORDER BY id`)).map((row) => row.id)).toEqual(['r1', 'r2']);
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${own}"`);
        }
      });
    });

    describe('the reason phrase (status_message)', () => {
      const withPhrase = (text: string, statusMessage: string, status = 201): StoredResponse => ({
        ...response(text, status),
        statusMessage,
      });
      const phraseOf = async (target: PostgresStore, id: string) => {
        const record = await target.get(id);
        return record?.state === 'completed' ? [record.response.status, record.response.statusMessage] : record?.state;
      };
      // The records table as the versions before status_message made it (lease_until, no phrase).
      const tableBeforePhrase = async (name: string) => {
        await sql(client, `DROP TABLE IF EXISTS "${name}"`);
        await sql(
          client,
          `CREATE TABLE "${name}" (id text PRIMARY KEY, state text NOT NULL CHECK (state IN ('in_progress', 'completed')),
             token text NOT NULL, fingerprint text NOT NULL, status integer, headers jsonb, body bytea,
             expires_at timestamptz NOT NULL, lease_until timestamptz)`,
        );
        await sql(client, `CREATE INDEX "${name}_expires_at" ON "${name}" (expires_at)`);
      };
      // What a store that cannot keep a phrase in its table still does, keeping none: it claims,
      // renews, completes (`phrase` given) and replays, and commits a transaction with its writes.
      // Returns the ids of the record completed and of the one committed in a transaction.
      const servesWithoutPhrase = async (deployed: PostgresStore, phrase: string) => {
        const id = freshId();
        expect(await deployed.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({
          claimed: true,
        });
        expect(await deployed.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
        expect(
          await deployed.complete({ id, token: 't', response: withPhrase('ok', phrase), retentionMs: 60_000 }),
        ).toBe(true);
        expect(await phraseOf(deployed, id)).toEqual([201, undefined]);
        const replay = await deployed.claim({ id, token: 'u', fingerprint: 'fp', leaseMs: 5_000 });
        expect(replay.claimed === false && replay.record.state).toBe('completed');

        const inTransaction = freshId();
        await deployed.claim({ id: inTransaction, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
        const outcome = await deployed.transaction({ id: inTransaction, token: 't' }, async (tx) => {
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [inTransaction]);
          return { value: 'ran', response: withPhrase('ok', phrase), retentionMs: 60_000 };
        });
        expect(outcome).toEqual({ committed: true, value: 'ran' });
        expect(await effectCount(inTransaction)).toBe(1);
        expect(await phraseOf(deployed, inTransaction)).toEqual([201, undefined]);
        return { id, inTransaction };
      };

      it('is committed with the response in transactional mode; a response without one stores none, also over an earlier one', async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
        const first = await store.transaction({ id, token: 't' }, async () => ({
          value: 'ran',
          response: withPhrase('made', 'Created Fine'),
          retentionMs: 60_000,
        }));
        expect(first).toEqual({ committed: true, value: 'ran' });
        expect(await phraseOf(store, id)).toEqual([201, 'Created Fine']);
        // Its retention over, the key runs again, and its new answer has the default phrase.
        await expire(id);
        expect(await store.claim({ id, token: 'u', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
        await store.transaction({ id, token: 'u' }, async () => ({
          value: 'ran',
          response: response('again', 200),
          retentionMs: 60_000,
        }));
        expect(await phraseOf(store, id)).toEqual([200, undefined]);
        const replay = await store.claim({ id, token: 'v', fingerprint: 'fp', leaseMs: 5_000 });
        expect(replay.claimed === false && replay.record.state === 'completed' && replay.record.response).toEqual(
          response('again', 200),
        );
      });

      it('is stored as given, characters beyond ASCII and an empty one included', async () => {
        for (const statusMessage of ['Créé – bien', '', 'x'.repeat(2_000)]) {
          const id = freshId();
          await store.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
          await store.complete({ id, token: 't', response: withPhrase('ok', statusMessage), retentionMs: 60_000 });
          expect(await phraseOf(store, id)).toEqual([201, statusMessage]);
        }
      });

      // A rolling deploy that starts this version before anyone runs its migrate(): the table has no
      // status_message column. Statements naming it would fail every request (42703); the store
      // runs the earlier statements instead and keeps no phrase until the column is there.
      it('a store on a table not migrated for it yet serves every operation, without the phrase', async () => {
        const early = `${table}_before_phrase`;
        try {
          await tableBeforePhrase(early);
          const deployed = postgresStore({ client, table: early });
          const { id, inTransaction } = await servesWithoutPhrase(deployed, 'Created Fine');

          const released = freshId();
          await deployed.claim({ id: released, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
          expect(await deployed.release({ id: released, token: 't' })).toBe(true);
          expect(await deployed.forget({ id, token: 't' })).toBe(true);
          expect(await deployed.purgeExpired()).toBe(0);

          // Migrated, the table keeps phrases for a store made from then on (a restart, the next
          // instance); an instance already running asks again within its recheck (see the next test).
          await migrate(client, { table: early });
          const next = postgresStore({ client, table: early });
          const later = freshId();
          await next.claim({ id: later, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
          await next.complete({
            id: later,
            token: 't',
            response: withPhrase('ok', 'Created Fine'),
            retentionMs: 60_000,
          });
          expect(await phraseOf(next, later)).toEqual([201, 'Created Fine']);
          // The record written before the column replays the default phrase.
          expect(await phraseOf(next, inTransaction)).toEqual([201, undefined]);
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${early}"`);
        }
      });

      it('is asked of the catalog once when there, and again only after a while when missing', async () => {
        const early = `${table}_phrase_recheck`;
        try {
          await tableBeforePhrase(early);
          let now = 1_000_000;
          const column = statusMessageColumn(createSqlClient(client), parseTableName(early), 'tag', () => now);
          expect(await column.present('claim')).toBe(false);
          await migrate(client, { table: early });
          now += 29_000;
          expect(await column.present('claim'), 'asked again too soon').toBe(false);
          now += 1_000;
          expect(await column.present('claim')).toBe(true);
          // Found, it is never asked again: the steady state costs no round trip.
          await sql(client, `ALTER TABLE "${early}" DROP COLUMN status_message`);
          now += 3_600_000;
          expect(await column.present('claim')).toBe(true);
          // A statement that finds it gone says so; the next calls ask again after a while.
          column.missing();
          expect(await column.present('claim')).toBe(false);
          await migrate(client, { table: early });
          now += 30_000;
          expect(await column.present('claim')).toBe(true);
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${early}"`);
        }
      });

      // Was a defect: the catalog check looked at the column's name only, so a status_message of
      // another type (added by hand, or by another tool) made every claim fail (the claim's UNION
      // meets text with integer, 42804) and every completion with a phrase too: a 500 or 503 per
      // request, where a table without the column serves them all. migrate() refuses such a column
      // with a message naming it; the store, until someone fixes it, serves without the phrase.
      it.each([
        ['integer', 'integer'],
        ['jsonb', 'jsonb'],
        // A length would refuse a longer phrase at completion (migrate() refuses it too).
        ['varchar(8)', 'varchar(8)'],
      ])('a status_message column of type %s is served as if it were not there', async (_label, type) => {
        const odd = `${table}_phrase_typed`;
        try {
          await tableBeforePhrase(odd);
          await sql(client, `ALTER TABLE "${odd}" ADD COLUMN status_message ${type}`);
          // Longer than varchar(8): a completion that wrote it would fail.
          await servesWithoutPhrase(postgresStore({ client, table: odd }), 'Created Fine and dandy');
          await expect(migrate(client, { table: odd })).rejects.toThrow(/column status_message is/);
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${odd}"`);
        }
      });

      // Was a defect: the store timed its recheck with Date.now, whatever the test (or the host) did
      // with time; now on its own clock, which the tests inject.
      it('a running store keeps phrases once the column is there, 30 s later on its clock and not before', async () => {
        const early = `${table}_phrase_clock`;
        try {
          await tableBeforePhrase(early);
          let now = 5_000_000;
          const running = postgresStoreOnClock({ client, table: early }, () => now);
          const completedWith = async (statusMessage: string) => {
            const id = freshId();
            await running.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
            await running.complete({ id, token: 't', response: withPhrase('ok', statusMessage), retentionMs: 60_000 });
            return phraseOf(running, id);
          };
          expect(await completedWith('Before')).toEqual([201, undefined]);
          await migrate(client, { table: early });
          now += 29_999;
          expect(await completedWith('Too soon'), 'asked the catalog again before 30 s').toEqual([201, undefined]);
          now += 1;
          expect(await completedWith('After')).toEqual([201, 'After']);
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${early}"`);
        }
      });

      // Was a defect: the default was the wall clock, so one stepped back (NTP, a resumed VM) put the
      // recheck off by as long, and a running store kept no phrase for that while.
      it('by default the recheck is timed by a monotonic clock, which a wall clock stepped back does not delay', async () => {
        const early = `${table}_phrase_wall`;
        const wall = vi.spyOn(Date, 'now');
        const monotonic = vi.spyOn(performance, 'now');
        try {
          await tableBeforePhrase(early);
          const running = postgresStore({ client, table: early });
          wall.mockReturnValue(10_000_000);
          monotonic.mockReturnValue(1_000);
          expect(await running.get(freshId())).toBeUndefined();
          await migrate(client, { table: early });
          wall.mockReturnValue(10_000_000 - 3_600_000);
          monotonic.mockReturnValue(31_000);
          const id = freshId();
          await running.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
          await running.complete({ id, token: 't', response: withPhrase('ok', 'After'), retentionMs: 60_000 });
          expect(await phraseOf(running, id)).toEqual([201, 'After']);
        } finally {
          wall.mockRestore();
          monotonic.mockRestore();
          await sql(client, `DROP TABLE IF EXISTS "${early}"`);
        }
      });

      // The column dropped after the store saw it (a migration rolled back by hand): its statements
      // fail with 42703 once, and it goes on without the phrase instead of failing every request.
      it('a store whose table lost the column after it saw it goes on without the phrase', async () => {
        const shrinking = `${table}_phrase_dropped`;
        try {
          await migrate(client, { table: shrinking });
          const running = postgresStore({ client, table: shrinking });
          const before = freshId();
          await running.claim({ id: before, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
          await running.complete({ id: before, token: 't', response: withPhrase('ok', 'Fine'), retentionMs: 60_000 });
          expect(await phraseOf(running, before)).toEqual([201, 'Fine']);
          await sql(client, `ALTER TABLE "${shrinking}" DROP COLUMN status_message`);
          const id = freshId();
          expect(await running.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
          expect(
            await running.complete({ id, token: 't', response: withPhrase('ok', 'Fine'), retentionMs: 60_000 }),
          ).toBe(true);
          expect(await phraseOf(running, id)).toEqual([201, undefined]);
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${shrinking}"`);
        }
      });

      // Was a defect: a store that had seen a usable column kept naming it for ever, so a column whose
      // type was changed under it (a bad manual migration) failed every claim (42804: the UNION meets
      // text with the new type), every completion with a phrase (42804, or 22001 for one longer than a
      // varchar(n)) and, on pg, every read through a statement prepared before (0A000: a cached plan
      // must not change its result type), until the process restarted. A fresh store serves such a
      // table without the phrase; so does a running one now, and keeps it again once the type is text.
      it.each([
        ['integer', 'integer USING NULL'],
        ['jsonb', 'jsonb USING NULL'],
        // The phrases already kept are cut to fit, or the ALTER fails.
        ['varchar(5)', 'varchar(5) USING left(status_message, 5)'],
      ])(
        'a store whose status_message became %s after it saw it goes on without the phrase, and keeps it again once text',
        async (_label, type) => {
          const retyped = `${table}_phrase_retyped`;
          // Longer than a varchar(5): a completion that wrote it would fail.
          const long = 'Created Fine and dandy';
          try {
            await migrate(client, { table: retyped });
            let now = 9_000_000;
            const running = postgresStoreOnClock({ client, table: retyped }, () => now);
            const retype = (to: string) =>
              sql(client, `ALTER TABLE "${retyped}" ALTER COLUMN status_message TYPE ${to}`);
            // Read through a replay rather than get(): the claim's columns keep their types whatever the
            // column's, so the answer does not depend on which pg connection prepared what.
            const replayedPhrase = async (id: string) => {
              const replay = await running.claim({ id, token: 'r', fingerprint: 'fp', leaseMs: 5_000 });
              return replay.claimed === false && replay.record.state === 'completed'
                ? replay.record.response.statusMessage
                : replay;
            };
            // Completes a fresh record with the phrase; its id, and the phrase its replay says.
            const completedWithPhrase = async () => {
              const id = freshId();
              await running.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
              await running.complete({ id, token: 't', response: withPhrase('ok', long), retentionMs: 60_000 });
              return { id, replayed: await replayedPhrase(id) };
            };
            const keepsPhrase = async () => {
              const { id, replayed } = await completedWithPhrase();
              expect(replayed).toBe(long);
              return id;
            };
            // A transactional handler that writes and completes `id` (claimed with token t) with the phrase.
            const inTransaction = (id: string) =>
              running.transaction({ id, token: 't' }, async (tx) => {
                await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [id]);
                return { value: 'ran', response: withPhrase('ok', long), retentionMs: 60_000 };
              });
            // Each operation in turn meets the change first, after the store served with the column
            // (its statements prepared, on pg, while it was text).
            for (const first of ['claim', 'complete', 'get', 'replay', 'transaction'] as const) {
              if (first !== 'claim') {
                await retype('text USING status_message::text');
                now += 30_000;
              }
              const done = await keepsPhrase();
              expect(await phraseOf(running, done)).toEqual([201, long]);
              const [pending, next] = [freshId(), freshId()];
              for (const id of [pending, next])
                await running.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
              await retype(type);
              if (first === 'claim') {
                expect(await running.claim({ id: freshId(), token: 't', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({
                  claimed: true,
                });
              } else if (first === 'complete') {
                const stored = { id: pending, token: 't', response: withPhrase('ok', long), retentionMs: 60_000 };
                expect(await running.complete(stored)).toBe(true);
              } else if (first === 'get') {
                expect((await running.get(done))?.state).toBe('completed');
              } else if (first === 'replay') {
                const replay = await running.claim({ id: done, token: 'u', fingerprint: 'fp', leaseMs: 5_000 });
                expect(replay.claimed === false && replay.record.state).toBe('completed');
              } else {
                // Met inside a handler's transaction, the change costs that transaction (rolled back,
                // nothing of it kept; the engine answers 503), as a column dropped does: the store
                // cannot run its statement again there. The next ones store without the phrase.
                await expect(inTransaction(pending)).rejects.toMatchObject({
                  code: type.startsWith('varchar') ? '22001' : '42804',
                });
                expect(await effectCount(pending)).toBe(0);
                expect(await inTransaction(next)).toEqual({ committed: true, value: 'ran' });
                expect(await effectCount(next)).toBe(1);
              }
              // No restart, no 30 s: every operation as a fresh store on that table serves it.
              await servesWithoutPhrase(running, long);
            }

            // Asked again after 30 s, the catalog says the column is no use by its type: still without
            // the phrase, and a transaction (whose completion the store cannot run again) commits.
            const pending = freshId();
            await running.claim({ id: pending, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
            now += 30_000;
            expect(await inTransaction(pending)).toEqual({ committed: true, value: 'ran' });
            expect(await replayedPhrase(pending)).toBeUndefined();
            await servesWithoutPhrase(running, long);

            // Text again: within 30 s on the store's clock, it keeps phrases again, without a restart.
            await retype('text USING status_message::text');
            now += 29_999;
            expect((await completedWithPhrase()).replayed, 'asked the catalog again before 30 s').toBeUndefined();
            now += 1;
            await keepsPhrase();
          } finally {
            await sql(client, `DROP TABLE IF EXISTS "${retyped}"`);
          }
        },
      );
      // The codes a column of another type fails with do not name it, so the statement runs again
      // without the phrase; a failure of another column's making fails that one too, and is thrown.
      it("a datatype mismatch that is not the phrase column's is still thrown, on every path", async () => {
        const broken = `${table}_phrase_unrelated`;
        try {
          await migrate(client, { table: broken });
          const running = postgresStore({ client, table: broken });
          const [id, other] = [freshId(), freshId()];
          for (const each of [id, other])
            await running.claim({ id: each, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
          // The completions write `$4::jsonb` into it: 42804, whatever the phrase.
          await sql(client, `ALTER TABLE "${broken}" ALTER COLUMN headers TYPE bytea USING NULL`);
          const stored = { token: 't', response: withPhrase('ok', 'Fine'), retentionMs: 60_000 };
          await expect(running.complete({ id, ...stored })).rejects.toMatchObject({ code: '42804' });
          await expect(running.complete({ id, ...stored })).rejects.toMatchObject({ code: '42804' });
          await expect(
            running.transaction({ id: other, token: 't' }, async () => ({ value: 'ran', ...stored })),
          ).rejects.toMatchObject({ code: '42804' });
          expect((await running.get(id))?.state).toBe('in_progress');
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${broken}"`);
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

      // Was wrong: a handler that swallowed a failed statement ("insert, ignore the unique
      // violation", without a SAVEPOINT) left the transaction aborted (25P02); the completion then
      // failed with that raw error, which the engine took for the store's (503 store_unavailable and
      // a store-error, on every retry). It is the handler's failure, told apart by name and code.
      for (const response_ of ['a response', 'no response (release)'] as const) {
        it(`rejects with TransactionAbortedError when the handler left the transaction aborted, with ${response_}`, async () => {
          const id = freshId();
          const marker = randomUUID();
          await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
          const failure = await store
            .transaction({ id, token: 't' }, async (tx) => {
              await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
              await tx.query('SELECT 1 / 0').catch(() => undefined);
              return {
                value: undefined,
                response: response_ === 'a response' ? response('never') : undefined,
                retentionMs: 60_000,
              };
            })
            .catch((error: unknown) => error);
          expect(failure).toBeInstanceOf(TransactionAbortedError);
          expect(isTransactionAbortedError(failure)).toBe(true);
          expect(failure).not.toBeInstanceOf(StoreUnavailableError);
          expect((failure as { code?: string }).code).toBe('transaction_aborted');
          expect(((failure as Error).cause as { code?: string }).code).toBe('25P02');
          expect(await effectCount(marker)).toBe(0);
          expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
          // The connection is usable again afterwards.
          expect(await store.release({ id, token: 't' })).toBe(true);
        });
      }

      it('through the engine, a transaction left aborted is rethrown as the handler failure, with no store-error', async () => {
        const events: IdempotencyEvent[] = [];
        const engine = createIdempotency({ store, heartbeat: false, onEvent: (event) => events.push(event) });
        const request = { key: randomUUID(), scope: 'user:1', operation: 'POST /orders' };
        const first = await engine.begin(request);
        if (first.kind !== 'execute') throw new Error(`expected execute, got ${first.kind}`);
        const failure = await engine
          .transaction(first.lease, async (tx: { query(text: string): Promise<unknown> }) => {
            await tx.query('SELECT 1 / 0').catch(() => undefined);
            return { value: undefined, response: response('{}') };
          })
          .catch((error: unknown) => error);
        expect(isTransactionAbortedError(failure)).toBe(true);
        expect(events.filter((event) => event.type === 'store-error')).toEqual([]);
        // As for a handler that threw, the lease is still held: the caller releases it.
        expect((await store.get(first.lease.id))?.state).toBe('in_progress');
        expect(await engine.release(first.lease)).toEqual({ ok: true });
        expect((await engine.begin(request)).kind).toBe('execute');
      });

      // Was wrong: a deferred constraint that refused the handler's writes at COMMIT (a unique key
      // DEFERRABLE INITIALLY DEFERRED, a constraint trigger) came out as that raw error, which the
      // engine took for the store's: a store-error event and 503 store_unavailable, "retry", when the
      // store was fine and the retry would fail the same way. The handler's data failed: it is
      // TransactionAbortedError, the record left in progress for the engine to release.
      it("rejects with TransactionAbortedError when a deferred constraint refuses the handler's writes at COMMIT", async () => {
        const id = freshId();
        const marker = randomUUID();
        const slot = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const failure = await store
          .transaction({ id, token: 't' }, async (tx) => {
            await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
            // Twice: accepted by each statement, refused by the COMMIT.
            await tx.query(`INSERT INTO "${deferred}" (slot) VALUES ($1), ($1)`, [slot]);
            return { value: undefined, response: response('never'), retentionMs: 60_000 };
          })
          .catch((error: unknown) => error);
        expect(isTransactionAbortedError(failure)).toBe(true);
        expect(failure).not.toBeInstanceOf(StoreUnavailableError);
        expect(((failure as Error).cause as { code?: string }).code).toBe('23505');
        expect(await effectCount(marker)).toBe(0);
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
        // The connection is usable again afterwards.
        expect(await store.release({ id, token: 't' })).toBe(true);
      });

      it('through the engine, a COMMIT refused by a deferred constraint is the handler failure, and a corrected retry runs', async () => {
        const events: IdempotencyEvent[] = [];
        const engine = createIdempotency({ store, heartbeat: false, onEvent: (event) => events.push(event) });
        const request = { key: randomUUID(), scope: 'user:1', operation: 'POST /orders' };
        const slot = randomUUID();
        const first = await engine.begin(request);
        if (first.kind !== 'execute') throw new Error(`expected execute, got ${first.kind}`);
        const failure = await engine
          .transaction(first.lease, async (tx: PostgresTransaction) => {
            await tx.query(`INSERT INTO "${deferred}" (slot) VALUES ($1), ($1)`, [slot]);
            return { value: undefined, response: response('{}') };
          })
          .catch((error: unknown) => error);
        expect(isTransactionAbortedError(failure)).toBe(true);
        expect(events.filter((event) => event.type === 'store-error')).toEqual([]);
        // As for a handler that threw, the lease is still held: the caller releases it.
        expect((await store.get(first.lease.id))?.state).toBe('in_progress');
        expect(await engine.release(first.lease)).toEqual({ ok: true });
        const retry = await engine.begin(request);
        if (retry.kind !== 'execute') throw new Error(`expected execute, got ${retry.kind}`);
        const fixed = await engine.transaction(retry.lease, async (tx: PostgresTransaction) => {
          await tx.query(`INSERT INTO "${deferred}" (slot) VALUES ($1)`, [slot]);
          return { value: 'ok', response: response('{}') };
        });
        expect(fixed).toMatchObject({ committed: true, value: 'ok' });
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

      // Was a defect: a ROLLBACK or COMMIT sent through `tx` ended the store's transaction and the
      // session went on in autocommit. Every later statement of the handler committed on its own, and
      // so did the completion: a late executor's writes persisted although the call answered
      // { committed: false }, and a handler that rolled its writes back got its response stored as
      // if they had happened. The handle now refuses to go on once the transaction is no longer open.
      for (const ending of ['ROLLBACK', 'COMMIT']) {
        it(`refuses to go on after the handler sent ${ending} through tx: nothing after it commits on its own`, async () => {
          const id = freshId();
          const marker = randomUUID();
          await store.claim({ id, token: 'old', fingerprint: '', leaseMs: 5_000 });
          await expire(id);
          await store.claim({ id, token: 'new', fingerprint: '', leaseMs: 5_000 });
          const ended: unknown[] = [];
          const outcome = store.transaction({ id, token: 'old' }, async (tx) => {
            await tx.query(ending).catch((error: unknown) => ended.push(error));
            await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]).catch(() => undefined);
            return { value: 'late', response: response('late'), retentionMs: 60_000 };
          });
          await expect(outcome).rejects.toThrow(TypeError);
          expect(ended).toEqual([expect.any(TypeError)]);
          expect(await effectCount(marker)).toBe(0);
          expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'new', fingerprint: '' });
        });
      }

      it('never stores the response of a handler that rolled its own writes back through tx', async () => {
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const outcome = store.transaction({ id, token: 't' }, async (tx) => {
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
          await tx.query('ROLLBACK').catch(() => undefined);
          return { value: 'ok', response: response('ok'), retentionMs: 60_000 };
        });
        await expect(outcome).rejects.toThrow(/ended the store's transaction/);
        expect(await effectCount(marker)).toBe(0);
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
      });

      // The check must not take what stays inside the transaction for its end: ROLLBACK TO SAVEPOINT
      // (whose command tag is ROLLBACK), a statement that fails and leaves it aborted, SET LOCAL.
      it('lets a handler use savepoints and SET LOCAL: a statement rolled back to a savepoint is all that is undone', async () => {
        const id = freshId();
        const kept = randomUUID();
        const undone = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const outcome = await store.transaction({ id, token: 't' }, async (tx) => {
          await tx.query(`SET LOCAL statement_timeout = '5s'`);
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [kept]);
          await tx.query('SAVEPOINT before_second');
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [undone]);
          await tx.query('SELECT 1 / 0').catch(() => undefined);
          await tx.query('ROLLBACK TO SAVEPOINT before_second');
          await tx.query('RELEASE SAVEPOINT before_second');
          return { value: 'ok', response: response('ok'), retentionMs: 60_000 };
        });
        expect(outcome).toEqual({ committed: true, value: 'ok' });
        expect(await effectCount(kept)).toBe(1);
        expect(await effectCount(undone)).toBe(0);
        expect((await store.get(id))?.state).toBe('completed');
      });

      // Was a defect: only a statement that succeeded was followed by the check. A COMMIT sent through
      // tx that fails (a deferred constraint, a serialization failure) rolls the transaction back and
      // leaves the session idle, and rejects: a handler that caught that error and went on had its
      // later writes, and the completion, committed one by one in autocommit.
      it('refuses to go on after a COMMIT sent through tx failed and ended the transaction', async () => {
        const id = freshId();
        const marker = randomUUID();
        const deferred = `${effects}_deferred`;
        await sql(client, `CREATE TABLE "${deferred}" (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)`);
        try {
          await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
          const failed: unknown[] = [];
          const outcome = store.transaction({ id, token: 't' }, async (tx) => {
            await tx.query(`INSERT INTO "${deferred}" (v) VALUES (1), (1)`);
            await tx.query('COMMIT').catch((error: unknown) => failed.push(error));
            await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]).catch(() => undefined);
            return { value: 'ok', response: response('ok'), retentionMs: 60_000 };
          });
          await expect(outcome).rejects.toThrow(/ended the store's transaction/);
          expect(failed).toHaveLength(1);
          expect(await effectCount(marker)).toBe(0);
          expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${deferred}"`);
        }
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

      it('refuses a malformed id, token or retention with TypeError, running or committing nothing', async () => {
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        let runs = 0;
        const handler = async () => {
          runs++;
          return { value: undefined, response: response('x'), retentionMs: 60_000 };
        };
        // An empty id or token matches no record: without the check the handler would run for nothing.
        await expect(store.transaction({ id: '', token: 't' }, handler)).rejects.toThrow(TypeError);
        await expect(store.transaction({ id, token: '' }, handler)).rejects.toThrow(TypeError);
        // Nor one `text` cannot hold (a NUL) or pg sends as U+FFFD (a lone surrogate): the handler
        // ran, then the completion failed with a raw 22021, or fenced on a token that is not the
        // caller's. Refused as every store refuses them, before the transaction opens.
        for (const bad of ['\u0000', '\ud800', '\udc00']) {
          await expect(store.transaction({ id: `${id}${bad}`, token: 't' }, handler)).rejects.toThrow(TypeError);
          await expect(store.transaction({ id, token: `t${bad}` }, handler)).rejects.toThrow(TypeError);
        }
        expect(runs).toBe(0);
        // A retention of 0 would commit a record that is gone at once, and the handler's writes with it.
        const failure = await store
          .transaction({ id, token: 't' }, async (tx) => {
            await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
            return { value: undefined, response: response('x'), retentionMs: 0 };
          })
          .catch((error: unknown) => error);
        expect(failure).toBeInstanceOf(TypeError);
        expect(await effectCount(marker)).toBe(0);
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
      });

      it('counts the retention from the completion, by clock_timestamp(), not from the start of the transaction', async () => {
        const id = freshId();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        let during = '';
        const result = await store.transaction({ id, token: 't' }, async (tx) => {
          // Let the database clock move past the transaction's start (now()), polling it, not sleeping.
          for (let moved = false; !moved; ) {
            const { rows } = await tx.query<{ at: string; moved: boolean }>(
              'SELECT clock_timestamp()::text AS at, clock_timestamp() > now() AS moved',
            );
            during = rows[0]?.at ?? '';
            moved = rows[0]?.moved === true;
          }
          return { value: undefined, response: response('x'), retentionMs: 60_000 };
        });
        expect(result).toEqual({ committed: true, value: undefined });
        // The record lives 60 s from its completion: no less (from BEGIN it would end before
        // `during` + 60 s), and no more (milliseconds, not seconds).
        const [row] = await sql(
          client,
          `SELECT expires_at >= $2::timestamptz + interval '60 seconds' AS from_completion,
                  expires_at <= clock_timestamp() + interval '60 seconds' AS within
             FROM "${table}" WHERE id = $1`,
          [id, during],
        );
        expect(row).toEqual({ from_completion: true, within: true });
      });

      it('never completes nor deletes a record already completed, even with its own token', async () => {
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await store.complete({ id, token: 't', response: response('first'), retentionMs: 60_000 });
        // A second transactional run with the same lease (a caller bug, or a retry of the whole call)
        // must neither overwrite the stored outcome nor, answering undefined, drop it.
        for (const outcome of [response('second'), undefined]) {
          const result = await store.transaction({ id, token: 't' }, async (tx) => {
            await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
            return { value: 'again', response: outcome, retentionMs: 60_000 };
          });
          expect(result).toEqual({ committed: false });
        }
        expect(await effectCount(marker)).toBe(0);
        const record = await store.get(id);
        expect(record?.state).toBe('completed');
        if (record?.state === 'completed') expect(new TextDecoder().decode(record.response.body)).toBe('first');
      });

      it('releases a lease that ran out during the handler when nobody took it over', async () => {
        // The same compare-and-set on the token alone as a completion: "nothing happened, let the
        // retry run" still commits the handler's writes and frees the key.
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        await expire(id);
        const result = await store.transaction({ id, token: 't' }, async (tx) => {
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
          return { value: 'released', response: undefined, retentionMs: 60_000 };
        });
        expect(result).toEqual({ committed: true, value: 'released' });
        expect(await effectCount(marker)).toBe(1);
        expect(await rowExists(id)).toBe(false);
      });

      it('releases nothing and commits nothing with a token that is no longer current', async () => {
        const id = freshId();
        const marker = randomUUID();
        await store.claim({ id, token: 'old', fingerprint: '', leaseMs: 5_000 });
        await expire(id);
        await store.claim({ id, token: 'new', fingerprint: '', leaseMs: 5_000 });
        const result = await store.transaction({ id, token: 'old' }, async (tx) => {
          await tx.query(`INSERT INTO "${effects}" (marker) VALUES ($1)`, [marker]);
          return { value: 'late', response: undefined, retentionMs: 60_000 };
        });
        expect(result).toEqual({ committed: false });
        expect(await effectCount(marker)).toBe(0);
        expect(await store.get(id)).toEqual({ state: 'in_progress', token: 'new', fingerprint: '' });
      });

      it('a COMMIT that fails for a transient reason rejects with StoreUnavailableError, and nothing persists', async () => {
        // A deferred check runs at COMMIT; this one fails as a deferred check that could not get its
        // lock in time would (55P03). The outcome of the commit is "not now", not a mistake in SQL.
        const deferred = `${table}_deferred`;
        await sql(
          client,
          `CREATE FUNCTION "${deferred}_fail"() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'lock not available' USING ERRCODE = '55P03'; END $$`,
        );
        await sql(client, `CREATE TABLE "${deferred}" (marker text)`);
        await sql(
          client,
          `CREATE CONSTRAINT TRIGGER "${deferred}_check" AFTER INSERT ON "${deferred}"
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "${deferred}_fail"()`,
        );
        try {
          const id = freshId();
          await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
          const failure = await store
            .transaction({ id, token: 't' }, async (tx) => {
              await tx.query(`INSERT INTO "${deferred}" (marker) VALUES ('x')`);
              return { value: 1, response: response('never'), retentionMs: 60_000 };
            })
            .catch((error: unknown) => error);
          expect(failure).toBeInstanceOf(StoreUnavailableError);
          expect(failure).toMatchObject({ cause: { code: '55P03' } });
          expect(await sql(client, `SELECT count(*)::int AS n FROM "${deferred}"`)).toEqual([{ n: 0 }]);
          expect(await store.get(id)).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
        } finally {
          await sql(client, `DROP TABLE IF EXISTS "${deferred}"`);
          await sql(client, `DROP FUNCTION IF EXISTS "${deferred}_fail"()`);
        }
      });
    });
  });
}
