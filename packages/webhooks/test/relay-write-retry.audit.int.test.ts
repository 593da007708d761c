// Audit of the relay's result-write retry and its database clock. Real PostgreSQL (a table of its
// own), real HTTP endpoints on ephemeral ports. The failures are made by a `db` that runs the write
// on the real pool and then loses its answer, as a connection that dies after the commit does.
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PGlite } from '@electric-sql/pglite';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type AttemptRecord, createOutbox, createSender, createVerifier, type Queryable } from '../src/index.js';
import { postgresAvailable, testPool } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('relay write-retry audit');

describe.skipIf(!available)('relay: a result write whose answer is lost', () => {
  const pool = testPool({ max: 5 });
  const table = `audit_review_wr_${randomBytes(4).toString('hex')}`;
  const outbox = createOutbox({ table });
  let url = '';
  let answer = 204;
  let arrivals = 0;
  const server = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      arrivals++;
      response.writeHead(answer);
      response.end();
    });
  });

  beforeAll(async () => {
    await outbox.migrate(pool);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  /** A db whose first result write lands and then fails, as if its connection died before the answer. */
  const losingFirstAnswer = () => {
    let lost = 0;
    return {
      lost: () => lost,
      query: async (text: string, values?: unknown[]) => {
        const result = await pool.query(text, values);
        if (lost === 0 && text.includes('last_attempt =')) {
          lost++;
          throw Object.assign(new Error('Connection terminated unexpectedly'), { code: 'ECONNRESET' });
        }
        return result;
      },
    };
  };

  const add = async (id: string) => {
    await pool.query(`DELETE FROM "${table}"`);
    await pool.query(`INSERT INTO "${table}" (id, url, body) VALUES ($1, $2, convert_to('{}', 'UTF8'))`, [id, url]);
  };

  // Was wrong: the write had landed, so its retry matched no row and the round counted the delivery
  // as `fenced`, which docs/webhooks.md reserves for "a lease ran out and another claim took the row
  // over" (an alert on `fenced` fired for a relay that had done its job). The retry now reads back
  // what its own claim's earlier try wrote.
  it('a delivered row whose write landed before its answer was lost counts as delivered, not fenced', async () => {
    answer = 204;
    arrivals = 0;
    await add('evt_wr_delivered');
    const db = losingFirstAnswer();
    const relay = outbox.relay({ db, sender: createSender({ secret: SECRET, timeout: '2s' }), lease: '8s' });
    const round = await relay.runOnce();
    expect(db.lost()).toBe(1);
    expect(round).toEqual({ claimed: 1, delivered: 1, retrying: 0, dead: 0, fenced: 0 });
    expect(arrivals).toBe(1);
    const { rows } = await pool.query(`SELECT status, jsonb_array_length(history) AS n FROM "${table}"`);
    expect(rows).toEqual([{ status: 'delivered', n: 1 }]);
  });

  // Was wrong, likewise: a failed attempt whose write landed was counted `fenced`, and onAttempt was
  // told it without the waitMs that comes before the next attempt, as if none would follow.
  it('a failed attempt whose write landed counts as retrying, and onAttempt gets its wait', async () => {
    answer = 503;
    await add('evt_wr_retrying');
    const db = losingFirstAnswer();
    const told: AttemptRecord[] = [];
    const relay = outbox.relay({
      db,
      sender: createSender({ secret: SECRET, timeout: '2s' }),
      lease: '8s',
      onAttempt: (_row, attempt) => told.push(attempt),
    });
    const round = await relay.runOnce();
    expect(round).toEqual({ claimed: 1, delivered: 0, retrying: 1, dead: 0, fenced: 0 });
    expect(told).toHaveLength(1);
    expect(told[0]?.waitMs).toBeGreaterThan(0);
    const { rows } = await pool.query(`SELECT status, attempts, locked_by FROM "${table}"`);
    expect(rows).toEqual([{ status: 'pending', attempts: 1, locked_by: null }]);
  });

  // Held: a write that is refused for good (not a lost answer) is not retried past its budget, the
  // round ends well inside the lease, and the row is left leased for a takeover, not written twice.
  it('a write that keeps failing gives up within its budget and reports the error', async () => {
    answer = 204;
    await add('evt_wr_broken');
    const db = {
      query: async (text: string, values?: unknown[]) => {
        if (text.includes('last_attempt =')) throw new Error('the write never lands');
        return pool.query(text, values);
      },
    };
    const relay = outbox.relay({ db, sender: createSender({ secret: SECRET, timeout: '2s' }), lease: '20s' });
    const started = performance.now();
    await expect(relay.runOnce()).rejects.toThrow('the write never lands');
    expect(performance.now() - started).toBeLessThan(5_000);
    const { rows } = await pool.query(`SELECT status, locked_by IS NOT NULL AS leased FROM "${table}"`);
    expect(rows).toEqual([{ status: 'pending', leased: true }]);
  });

  // Held: the claim's clock is the database's. A row claimed returns its database_now, and a claim
  // of no rows (an empty outbox) still makes a round, signing nothing.
  it('an empty claim is a round of zeros', async () => {
    await pool.query(`DELETE FROM "${table}"`);
    const relay = outbox.relay({ db: pool, sender: createSender({ secret: SECRET, timeout: '1s' }), lease: '3s' });
    expect(await relay.runOnce()).toEqual({ claimed: 0, delivered: 0, retrying: 0, dead: 0, fenced: 0 });
  });
});

// Held: on PGlite too the claim returns the database's clock as a number, and a relay whose own
// clock is an hour off signs what a verifying receiver accepts and dates its history by the database.
describe('relay on PGlite signs by the database clock', () => {
  it('a relay an hour off is accepted by a verifying receiver', async () => {
    const db = new PGlite();
    const outbox = createOutbox({ table: 'audit_review_pglite_clock' });
    const verifier = createVerifier({ secret: SECRET });
    const refusals: string[] = [];
    const server = createServer((request, response) => {
      const chunks: Buffer[] = [];
      request.on('data', (chunk: Buffer) => chunks.push(chunk));
      request.on('end', () => {
        const result = verifier.verify({ headers: request.headers, body: Buffer.concat(chunks) });
        if (!result.ok) refusals.push(result.error.code);
        response.writeHead(result.ok ? 204 : 400);
        response.end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      // The outbox documents a pg Pool "or anything with query()": PGlite's query() takes one
      // statement, so the migration's script goes through exec().
      const queryable: Queryable = {
        query: async (text, values) => {
          if (values === undefined || values.length === 0) {
            const results = await db.exec(text);
            const last = results.at(-1);
            return { rows: last?.rows ?? [], rowCount: last?.affectedRows ?? null };
          }
          const result = await db.query(text, values);
          return { rows: result.rows as unknown[], rowCount: result.affectedRows ?? null };
        },
      };
      await outbox.migrate(queryable);
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
      for (const id of ['evt_pg_1', 'evt_pg_2']) await outbox.add(queryable, { id, url, body: '{}' });
      const relay = outbox.relay({
        db: queryable,
        sender: createSender({ secret: SECRET, timeout: '2s', now: () => Date.now() - 3_600_000 }),
        lease: '5s',
      });
      expect(await relay.runOnce()).toMatchObject({ claimed: 2, delivered: 2, fenced: 0 });
      expect(refusals).toEqual([]);
      const { rows } = await db.query<{ started: number }>(
        `SELECT (last_attempt->>'startedAt')::float8 AS started FROM audit_review_pglite_clock`,
      );
      for (const { started } of rows) expect(Math.abs(started - Date.now())).toBeLessThan(60_000);
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
      await db.close();
    }
    // PGlite compiles its WebAssembly first: seconds on a loaded box.
  }, 30_000);
});
