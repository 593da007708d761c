// What counts as "the database is unavailable" (a 503 with Retry-After in every service) and what
// stays a 500. The errors are the drivers' own: PGlite's and pg's, raised by a database and a pool
// that really refuse, end a connection, or time out; a bug and a provider that cannot be reached are not.
import { createServer } from 'node:net';
import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { dbUnavailable } from '../src/db-unavailable.js';

/** What `promise` rejected with; fails when it resolves. */
const rejectionOf = async (promise: Promise<unknown>): Promise<unknown> => {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error('expected a rejection');
};

/** A statement the database refuses with the SQLSTATE `code`, as the server does for that fault. */
const raising = (code: string) => `do $$ begin raise exception 'refused' using errcode = '${code}'; end $$`;

/** A TCP port on which nothing listens. */
const closedPort = async () => {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
};

describe('dbUnavailable on PGlite', () => {
  it.each(['57P01', '57P02', '57P03', '08006', '08003'])('is true for SQLSTATE %s', async (code) => {
    const db = new PGlite();
    try {
      expect(dbUnavailable(await rejectionOf(db.query(raising(code))))).toBe(true);
    } finally {
      await db.close();
    }
  });

  it('is true for a PGlite that is closed', async () => {
    const db = new PGlite();
    await db.waitReady;
    await db.close();
    expect(dbUnavailable(await rejectionOf(db.query('select 1')))).toBe(true);
  });

  it('is false for a statement that is wrong: a syntax error, a unique violation, a missing table', async () => {
    const db = new PGlite();
    try {
      expect(dbUnavailable(await rejectionOf(db.query('selec 1')))).toBe(false);
      expect(dbUnavailable(await rejectionOf(db.query(raising('23505'))))).toBe(false);
      expect(dbUnavailable(await rejectionOf(db.query('select * from no_such_table')))).toBe(false);
    } finally {
      await db.close();
    }
  });

  // A statement sent with the wrong number of parameters (a bug of the app) fails with SQLSTATE 08P01
  // (protocol_violation), of the connection-exception class 08, which PgBouncer uses for its passing
  // failures too: told apart by PostgreSQL's "bind message" words, it stays a 500.
  it('is false for a statement sent with the wrong number of parameters (08P01, a bug)', async () => {
    const db = new PGlite();
    try {
      const error = await rejectionOf(db.query('select $1::int + $2::int', [1]));
      expect((error as { code?: unknown }).code).toBe('08P01');
      expect(dbUnavailable(error)).toBe(false);
    } finally {
      await db.close();
    }
  });
});

describe('dbUnavailable on pg', () => {
  it('is true for a connection refused', async () => {
    const pool = new pg.Pool({ host: '127.0.0.1', port: await closedPort(), user: 'nobody', max: 1 });
    try {
      expect(dbUnavailable(await rejectionOf(pool.query('select 1')))).toBe(true);
    } finally {
      await pool.end();
    }
  });

  it('is true for a pool that is closed', async () => {
    const pool = new pg.Pool({ host: '127.0.0.1', port: await closedPort(), max: 1 });
    await pool.end();
    expect(dbUnavailable(await rejectionOf(pool.query('select 1')))).toBe(true);
  });

  it.skipIf(!process.env.DATABASE_URL)(
    'is true for a pool timeout and a connection the server terminates, false for a wrong statement',
    async () => {
      const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 1, connectionTimeoutMillis: 50 });
      pool.on('error', () => {});
      const held = await pool.connect();
      // A checked-out client the server ends emits 'error' too; the test reads it from the query.
      held.on('error', () => {});
      try {
        // The one connection is held: the next query waits for it past the timeout.
        const timedOut = await rejectionOf(pool.query('select 1'));
        expect((timedOut as Error).message).toMatch(/timeout exceeded when trying to connect/);
        expect(dbUnavailable(timedOut)).toBe(true);
        expect(dbUnavailable(await rejectionOf(held.query(raising('57P01'))))).toBe(true);
        expect(dbUnavailable(await rejectionOf(held.query('selec 1')))).toBe(false);
        // The server ends the connection under a running statement (pg_terminate_backend: 57P01).
        const { rows } = await held.query<{ pid: number }>('select pg_backend_pid() as pid');
        const other = new pg.Client({ connectionString: process.env.DATABASE_URL });
        await other.connect();
        try {
          const running = rejectionOf(held.query('select pg_sleep(10)'));
          // Ended once the server runs the sleep, not before: asked until it is found sleeping.
          let ended = 0;
          while (ended === 0) {
            ({ rowCount: ended } = (await other.query(
              `select pg_terminate_backend(pid) from pg_stat_activity where pid = $1 and wait_event = 'PgSleep'`,
              [rows[0]!.pid],
            )) as { rowCount: number });
          }
          expect(dbUnavailable(await running)).toBe(true);
        } finally {
          await other.end();
        }
      } finally {
        held.release(true);
        await pool.end();
      }
    },
  );
});

describe('dbUnavailable for what is no database failure', () => {
  it('is false for a bug of the app, whatever its message says', () => {
    expect(dbUnavailable(new TypeError("Cannot read properties of undefined (reading 'tokens')"))).toBe(false);
    expect(dbUnavailable(new TypeError('Connection terminated unexpectedly'))).toBe(false);
    expect(dbUnavailable(new RangeError('Invalid array length'))).toBe(false);
    expect(dbUnavailable(undefined)).toBe(false);
  });

  it('is false for a fetch that could not connect (a provider that is down): its ECONNREFUSED is only its cause', async () => {
    const error = await rejectionOf(fetch(`http://127.0.0.1:${await closedPort()}/`));
    expect((error as Error).cause).toMatchObject({ code: 'ECONNREFUSED' });
    expect(dbUnavailable(error)).toBe(false);
  });
});
