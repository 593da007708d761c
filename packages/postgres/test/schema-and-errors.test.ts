// Pure unit tests: the shipped schema.sql is what migrate() runs, table names are validated before
// they reach SQL, and infrastructure failures are told apart from mistakes.
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { type AddressInfo, createServer } from 'node:net';
import { StoreUnavailableError } from '@idem/core';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { defaultTable, isTransientDatabaseError, postgresStore, schemaSql, schemaStatements } from '../src/index.js';
import {
  isSerializationFailure,
  maxSerializationPauseMs,
  retrySerializationFailures,
  serializationAttempts,
  serializationPauseMs,
} from '../src/serialization-retry.js';
import { parseTableName } from '../src/table-name.js';
import { toStoreError } from '../src/unavailable.js';

describe('schema', () => {
  it('schema.sql is exactly schemaSql() for the default table', async () => {
    const shipped = await readFile(new URL('../schema.sql', import.meta.url), 'utf8');
    expect(shipped).toBe(schemaSql());
    expect(shipped).toContain(`CREATE TABLE IF NOT EXISTS "${defaultTable}"`);
  });

  it('quotes every part of a qualified name and names the index after the table', () => {
    const [table, index] = schemaStatements('app.records');
    expect(table).toContain('CREATE TABLE IF NOT EXISTS "app"."records"');
    expect(index).toBe('CREATE INDEX IF NOT EXISTS "records_expires_at" ON "app"."records" (expires_at)');
  });

  it('names the index `<table>_expires_at` up to 63 characters, and cuts a longer name to 43 characters, a hash and the suffix', () => {
    // docs/stores.md: a table name of up to 52 characters keeps the plain name (exactly 63 for 52).
    const fits = 't'.repeat(52);
    expect(schemaStatements(fits)[1]).toBe(`CREATE INDEX IF NOT EXISTS "${fits}_expires_at" ON "${fits}" (expires_at)`);
    const long = 'u'.repeat(53);
    const hash = createHash('sha256').update(long).digest('hex').slice(0, 8);
    const cut = `${long.slice(0, 43)}_${hash}_expires_at`;
    expect(cut).toHaveLength(63);
    expect(schemaStatements(long)[1]).toBe(`CREATE INDEX IF NOT EXISTS "${cut}" ON "${long}" (expires_at)`);
    // The hash is of the table's own name, not of the schema-qualified one: the index lives in the
    // table's schema, and `public.<table>` and `<table>` must name the index alike.
    expect(schemaStatements(`app.${long}`)[1]).toBe(
      `CREATE INDEX IF NOT EXISTS "${cut}" ON "app"."${long}" (expires_at)`,
    );
  });

  it('accepts plain identifiers and refuses everything that would need escaping', () => {
    expect(parseTableName('idem_records')).toEqual({
      name: 'idem_records',
      sql: '"idem_records"',
      base: 'idem_records',
    });
    expect(parseTableName('App.Records_2').sql).toBe('"App"."Records_2"');
    for (const bad of ['', 'a"b', 'a;b', 'a b', 'a.b.c', '.a', 'a.', '9a', 'x'.repeat(64), 'é', 42, null]) {
      expect(() => parseTableName(bad as string)).toThrow(TypeError);
    }
    // Something that is no string at all is refused as such, not by whatever `.split` of it throws.
    for (const bad of [42, null]) expect(() => parseTableName(bad)).toThrow(/^table must be a string/);
  });
});

describe('infrastructure errors', () => {
  const coded = (code: string, message = 'failure') => Object.assign(new Error(message), { code });

  it('treats connection, resource, shutdown, timeout and transient SQLSTATEs as unavailability', () => {
    for (const code of [
      '08006',
      '08001',
      '53300',
      '57P01',
      '57P03',
      '57014',
      '55P03',
      '40001',
      '40P01',
      '25006',
      '58000',
      '58030',
      // The server ending a session idle in a transaction, or one past transaction_timeout (PG 17).
      '25P03',
      '25P04',
    ]) {
      expect(isTransientDatabaseError(coded(code)), code).toBe(true);
    }
    for (const code of ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND']) {
      expect(isTransientDatabaseError(coded(code)), code).toBe(true);
    }
    expect(isTransientDatabaseError(new Error('Connection terminated unexpectedly'))).toBe(true);
    expect(isTransientDatabaseError(new Error('timeout exceeded when trying to connect'))).toBe(true);
    expect(isTransientDatabaseError(new AggregateError([coded('ECONNREFUSED')], ''))).toBe(true);
  });

  it("treats PgBouncer's 08P01 failures as unavailability, a statement's wrong parameter count (08P01 too) as a bug", () => {
    const protocol = (message: string) => Object.assign(new Error(message), { code: '08P01' });
    expect(isTransientDatabaseError(protocol('query_wait_timeout'))).toBe(true);
    expect(isTransientDatabaseError(protocol('no more connections allowed (max_client_conn)'))).toBe(true);
    expect(isTransientDatabaseError(protocol('pgbouncer cannot connect to server'))).toBe(true);
    expect(
      isTransientDatabaseError(protocol('bind message supplies 1 parameters, but prepared statement "" requires 2')),
    ).toBe(false);
    expect(isTransientDatabaseError(protocol('bind message has 2 parameter formats but 1 parameters'))).toBe(false);
  });

  it('treats every socket-level failure Node reports as unavailability', () => {
    for (const code of [
      'ECONNREFUSED',
      'ECONNRESET',
      'ECONNABORTED',
      'ETIMEDOUT',
      'EPIPE',
      'ENOTFOUND',
      'EHOSTUNREACH',
      'ENETUNREACH',
      'EAI_AGAIN',
    ]) {
      expect(isTransientDatabaseError(coded(code)), code).toBe(true);
    }
  });

  it('treats the code-less messages of pg and PGlite for a lost or closed connection as unavailability', () => {
    for (const message of [
      'Connection terminated unexpectedly',
      'Connection terminated due to connection timeout',
      'timeout exceeded when trying to connect',
      'Query read timeout',
      'Client has encountered a connection error and is not queryable',
      'Client was closed and is not queryable',
      'Connection closed',
      'connection is closed',
      'Cannot use a pool after calling end on the pool',
      'PGlite is closed',
    ]) {
      expect(isTransientDatabaseError(new Error(message)), message).toBe(true);
    }
  });

  it('takes a code as a SQLSTATE class only when it is five characters long', () => {
    // A driver or library code that merely starts like a transient class is no SQLSTATE.
    for (const code of ['08', '0800', '080060', '53300x', '57P01 ']) {
      expect(isTransientDatabaseError(coded(code)), code).toBe(false);
    }
  });

  it('counts a StoreUnavailableError as unavailability, and passes it through as it is', () => {
    const unavailable = new StoreUnavailableError('PostgreSQL store unavailable during claim');
    expect(isTransientDatabaseError(unavailable)).toBe(true);
    // Not wrapped a second time: the message keeps naming the operation that failed first.
    expect(toStoreError(unavailable, 'commit')).toBe(unavailable);
    // One from another copy of @idem/core is recognised by its name.
    const foreign = Object.assign(new Error('unavailable'), { name: 'StoreUnavailableError' });
    expect(isTransientDatabaseError(foreign)).toBe(true);
    // ... and passed on as it is, not wrapped a second time (its message and cause stay its own).
    expect(toStoreError(foreign, 'commit')).toBe(foreign);
  });

  it('leaves mistakes alone: syntax, missing table, constraint violations, non-errors', () => {
    // 58P01 (a file the server cannot find) is not transient, unlike the rest of class 58.
    for (const code of ['42601', '42P01', '23505', '22P02', '58P01', '25001']) {
      expect(isTransientDatabaseError(coded(code)), code).toBe(false);
    }
    expect(isTransientDatabaseError(new Error('something else'))).toBe(false);
    expect(isTransientDatabaseError('ECONNREFUSED')).toBe(false);
    expect(isTransientDatabaseError(undefined)).toBe(false);
  });

  it('wraps only transient failures, with a message that names the operation and nothing else', () => {
    const cause = coded('57P01', 'terminating connection due to administrator command');
    const wrapped = toStoreError(cause, 'claim');
    expect(wrapped).toBeInstanceOf(StoreUnavailableError);
    expect((wrapped as StoreUnavailableError).code).toBe('store_unavailable');
    expect((wrapped as Error).message).toBe('PostgreSQL store unavailable during claim');
    expect((wrapped as Error).cause).toBe(cause);
    const mistake = coded('42P01');
    expect(toStoreError(mistake, 'claim')).toBe(mistake);
  });
});

describe("serialization failures of the store's own statements", () => {
  const coded = (code: string) => Object.assign(new Error('failure'), { code });
  const wrapped = (code: string) => toStoreError(coded(code), 'claim');

  it('recognises 40001, also inside the StoreUnavailableError the store wraps it in', () => {
    expect(isSerializationFailure(coded('40001'))).toBe(true);
    expect(wrapped('40001')).toBeInstanceOf(StoreUnavailableError);
    expect(isSerializationFailure(wrapped('40001'))).toBe(true);
    for (const other of [coded('40P01'), wrapped('57P01'), coded('23505'), new Error('40001'), '40001', undefined]) {
      expect(isSerializationFailure(other)).toBe(false);
    }
  });

  it('runs the statement again while it fails with 40001, and rethrows anything else at once', async () => {
    let calls = 0;
    const flaky = async () => {
      calls++;
      if (calls < 3) throw wrapped('40001');
      return 'done';
    };
    expect(await retrySerializationFailures(flaky)).toBe('done');
    expect(calls).toBe(3);

    calls = 0;
    const unique = coded('23505');
    const failing = async () => {
      calls++;
      throw unique;
    };
    await expect(retrySerializationFailures(failing)).rejects.toBe(unique);
    expect(calls).toBe(1);
  });

  it('gives up after a few attempts with the last failure, pausing between tries', async () => {
    let calls = 0;
    const last = wrapped('40001');
    const always = async () => {
      calls++;
      throw calls === serializationAttempts ? last : wrapped('40001');
    };
    const pauses: number[] = [];
    const pause = async (attempt: number) => {
      pauses.push(attempt);
    };
    await expect(retrySerializationFailures(always, pause)).rejects.toBe(last);
    expect(calls).toBe(serializationAttempts);
    // One pause between two tries, none after the last, none before the first.
    expect(pauses).toEqual(Array.from({ length: serializationAttempts - 1 }, (_, index) => index + 1));
  });

  it('pauses a random time up to 1, 2, 4, then at most 8 ms between tries', () => {
    const caps = [1, 2, 3, 4, 5, 7].map((attempt) => serializationPauseMs(attempt, 1));
    expect(caps).toEqual([1, 2, 4, 8, maxSerializationPauseMs, maxSerializationPauseMs]);
    expect(maxSerializationPauseMs).toBe(8);
    expect(serializationPauseMs(3, 0)).toBe(0);
    expect(serializationPauseMs(3, 0.5)).toBe(2);
  });
});

describe('a store whose database drops every connection', () => {
  // A real pg Pool against a server that accepts and closes each connection: every statement fails
  // with "Connection terminated unexpectedly", before any SQL runs.
  it('names the store operation in the error, not the prepared statement', async () => {
    const server = createServer((socket) => socket.destroy());
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    const pool = new pg.Pool({ host: '127.0.0.1', port, user: 'nobody', database: 'none', max: 1 });
    try {
      const store = postgresStore({ client: pool });
      const token = 't'.repeat(32);
      const response = { status: 201, headers: {}, body: new Uint8Array() };
      const attempts: Array<[string, () => Promise<unknown>]> = [
        ['claim', () => store.claim({ id: 'r'.repeat(43), token, fingerprint: 'f', leaseMs: 1_000 })],
        ['renew', () => store.renew({ id: 'r'.repeat(43), token, leaseMs: 1_000 })],
        ['complete', () => store.complete({ id: 'r'.repeat(43), token, response, retentionMs: 1_000 })],
        ['release', () => store.release({ id: 'r'.repeat(43), token })],
        ['get', () => store.get('r'.repeat(43))],
        ['purge', () => store.purgeExpired()],
      ];
      for (const [operation, attempt] of attempts) {
        const error = await attempt().then(
          () => undefined,
          (failure: unknown) => failure,
        );
        expect(error, operation).toBeInstanceOf(StoreUnavailableError);
        expect((error as Error).message, operation).toBe(`PostgreSQL store unavailable during ${operation}`);
      }
    } finally {
      await pool.end();
      server.close();
    }
  });
});
