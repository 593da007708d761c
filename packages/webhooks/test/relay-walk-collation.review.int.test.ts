// Review of the relay claim's walk through `_url` (fallbackSql): its recursive CTE starts from the
// URL where the last walk stopped, a text parameter. Against real PostgreSQL and a real endpoint.
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender } from '../src/index.js';
import { postgresAvailable, testPool } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('relay walk collation review');

describe.skipIf(!available)('the relay walk on a url column with a collation of its own', () => {
  const pool = testPool({ max: 4 });
  const table = `audit_review_walk_${randomBytes(4).toString('hex')}`;
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  // Was wrong: the walk's first row took the collation of a text parameter (the database's default)
  // and its recursive rows the column's, and PostgreSQL refuses a recursive query whose column
  // changes collation ("recursive query "walk" column 2 has collation "default" in non-recursive
  // term but collation "C" overall"). An outbox whose url column was given a collation (COLLATE "C",
  // as DBAs do for byte-order keys) failed every claim whose head was all rows it could not take:
  // the relay stopped delivering to every URL behind a backlog, each round an error.
  it('a claim behind a backlog longer than the head reaches the other URLs by the walk', async () => {
    const arrivals: string[] = [];
    const server = createServer((request, response) => {
      request.resume();
      request.on('end', () => {
        arrivals.push(String(request.headers['webhook-id']));
        response.end('ok');
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const outbox = createOutbox({ table });
      await outbox.migrate(pool);
      await pool.query(`ALTER TABLE "${table}" ALTER COLUMN url TYPE text COLLATE "C"`);
      // 1,500 due rows of one URL (the head a claim of 4 reads is 1,000), then one row of each of 3 others.
      await pool.query(
        `INSERT INTO "${table}" (id, url, body, next_attempt_at)
         SELECT 'evt_full_' || n, $1, convert_to('{}', 'UTF8'), now() - interval '1 hour' + n * interval '1 microsecond'
           FROM generate_series(1, 1500) AS n`,
        [`${base}/full`],
      );
      await pool.query(
        `INSERT INTO "${table}" (id, url, body, next_attempt_at)
         SELECT 'evt_other_' || n, $1 || n, convert_to('{}', 'UTF8'), now() - interval '1 second'
           FROM generate_series(1, 3) AS n`,
        [`${base}/o`],
      );
      const relay = outbox.relay({ db: pool, sender: createSender({ secret: SECRET }), batchSize: 4, maxPerUrl: 1 });
      const round = await relay.runOnce();
      expect(round).toEqual({ claimed: 4, delivered: 4, retrying: 0, dead: 0, fenced: 0 });
      expect(arrivals.sort()).toEqual(['evt_full_1', 'evt_other_1', 'evt_other_2', 'evt_other_3']);
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
