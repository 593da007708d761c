// Review of the relay claim's walk through `_url` (fallbackSql): its recursive CTE starts from the
// URL where the last walk stopped, a text parameter, and each relay keeps its own such cursor.
// Against real PostgreSQL and real endpoints.
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
  // Several relays, each walking from where its own last walk stopped: behind a dead endpoint's
  // backlog three times the head, 120 healthy URLs (more than a walk looks at) after 60 URLs whose
  // only row waits an hour. Every healthy event arrives once; none waits on another relay's cursor.
  it('Held: three relays with their own cursors deliver every healthy URL behind a dead endpoint, each event once', async () => {
    const arrivals = new Map<string, number>();
    const listenOn = async (answer: boolean) => {
      const server = createServer((request, response) => {
        request.resume();
        request.on('end', () => {
          const key = String(request.headers['webhook-id']);
          arrivals.set(key, (arrivals.get(key) ?? 0) + 1);
          if (answer) response.end('ok');
        });
      });
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      return { server, base: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
    };
    const dead = await listenOn(false);
    const healthy = await listenOn(true);
    const tableMany = `${table}_many`;
    const outbox = createOutbox({ table: tableMany });
    const relays: ReturnType<typeof outbox.relay>[] = [];
    try {
      await outbox.migrate(pool);
      const add = (urls: string[], perUrl: number, prefix: string, dueAgoMs: number) =>
        pool.query(
          `INSERT INTO "${tableMany}" (id, url, body, next_attempt_at)
           SELECT $2 || u || '_' || n, ($1::text[])[u], convert_to('{}', 'UTF8'),
                  now() - ($4::double precision * interval '1 millisecond') + (u * $3 + n) * interval '1 microsecond'
             FROM generate_series(1, array_length($1::text[], 1)) AS u, generate_series(1, $3::int) AS n`,
          [urls, prefix, perUrl, dueAgoMs],
        );
      await add([`${dead.base}/dead`], 3_000, 'evt_dead_', 3_600_000);
      await add(
        Array.from({ length: 60 }, (_, n) => `${healthy.base}/a-wait${String(n).padStart(3, '0')}`),
        1,
        'evt_wait_',
        -3_600_000,
      );
      const ok = Array.from({ length: 120 }, (_, n) => `${healthy.base}/b-ok${String(n).padStart(3, '0')}`);
      await add(ok, 2, 'evt_ok_', 60_000);
      await pool.query(`ANALYZE "${tableMany}"`);
      for (let n = 0; n < 3; n++) {
        const relay = outbox.relay({
          db: pool,
          sender: createSender({ secret: SECRET, timeout: '2s' }),
          batchSize: 8,
          pollInterval: '20ms',
        });
        relay.start();
        relays.push(relay);
      }
      const okEvents = () => [...arrivals.keys()].filter((key) => key.startsWith('evt_ok_'));
      const deadline = Date.now() + 30_000;
      while (okEvents().length < ok.length * 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      expect(okEvents().length).toBe(ok.length * 2);
      expect(okEvents().every((key) => arrivals.get(key) === 1)).toBe(true);
      expect([...arrivals.keys()].some((key) => key.startsWith('evt_wait_'))).toBe(false);
    } finally {
      await Promise.all(relays.map((relay) => relay.stop()));
      for (const { server } of [dead, healthy]) {
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      }
      await pool.query(`DROP TABLE IF EXISTS "${tableMany}"`);
    }
  });
});
