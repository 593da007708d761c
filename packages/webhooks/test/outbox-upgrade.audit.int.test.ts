// Audit (upgrade path): outbox rows that an earlier version wrote, read and written by this one.
// Before 02541c8 a row's `history` had no cap: a stuck event's row gained an entry per attempt, for
// as long as its horizon lasted (commit 69a9c78 wrote 300 entries for 300 attempts). Such rows are
// still pending in the table when this version's relays take over.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('outbox upgrade');

describe.skipIf(!available)('an outbox row written by an earlier version, with its history past the cap', () => {
  const pool = testPool();
  const table = uniqueTable('outbox_upgrade');
  const outbox = createOutbox({ table });
  const server = createServer((request, response) => {
    request.resume();
    response.writeHead(500).end('x'.repeat(200));
  });
  let url = '';

  beforeAll(async () => {
    await outbox.migrate(pool);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    server.close();
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  /** A stuck row as 69a9c78 left it: `attempts` attempts, one history entry each, due now. */
  const stuckRow = async (id: string, attempts: number) => {
    await outbox.add(pool, { id, url, body: '{"n":1}' });
    await pool.query(
      `UPDATE "${table}"
          SET attempts = $2, claims = $2,
              history = (SELECT jsonb_agg(jsonb_build_object('attempt', n, 'result', 'failed', 'status', 500,
                                                             'responseBody', repeat('x', 200)) ORDER BY n)
                           FROM generate_series(1, $2::int) AS n)
        WHERE id = $1`,
      [id, attempts],
    );
  };
  const historyOf = async (id: string) =>
    (
      (await pool.query(`SELECT history FROM "${table}" WHERE id = $1`, [id])).rows[0] as {
        history: { attempt: number; result: string }[];
      }
    ).history.map((entry) => entry.attempt);
  // No wait between attempts, and no horizon or attempt limit in the way.
  const sender = createSender({ secret: SECRET, timeout: '5s', random: () => 0 });

  it('is cut to the first 10 and the latest 90 attempts by the next attempt this version records', async () => {
    await stuckRow('stuck-300', 300);
    expect(await outbox.relay({ db: pool, sender }).runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    expect(await historyOf('stuck-300')).toEqual([
      ...Array.from({ length: 10 }, (_, i) => i + 1),
      ...Array.from({ length: 90 }, (_, i) => i + 212),
    ]);
  });

  it('is cut by the entry of a lost claim too (the earlier relay died mid-attempt)', async () => {
    await stuckRow('lost-150', 150);
    await pool.query(
      `UPDATE "${table}" SET locked_by = 'old-relay', locked_until = now() - interval '1 second' WHERE id = 'lost-150'`,
    );
    await outbox.relay({ db: pool, sender }).runOnce();
    const history = await historyOf('lost-150');
    expect(history).toHaveLength(100);
    expect(history.slice(0, 11)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 62]);
    expect(history.at(-1)).toBe(150);
  });
});
