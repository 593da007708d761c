// Audit (volume): the hold after a 429 (holdUrl) rewrote every waiting row of the URL in one
// UPDATE, one transaction. Measured on 90,000 waiting rows of one URL (with the `_url` index, and
// once per round): 8.7 s for that one statement, the 90,000 row locks held all along, and the other
// relays' claims (FOR UPDATE SKIP LOCKED, walking past the locked rows at the head of the due index)
// at a median of 130 ms instead of 0.1 ms, up to 0.5 s. Its time grew with the URL's backlog, and a
// backlog a few times larger outlasted the round's lease (relay_round_timeout). The 410's
// dead-lettering (disableUrl) was the same one statement: 2.1 s for 90,000 rows. Both now go in
// batches of at most 1,000 rows, each its own statement (its own short transaction on a pool).
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createOutbox, createSender, type Queryable } from '../src/index.js';
import { startThrottlingEndpoint } from './support/endpoint.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('hold-batches audit');

// How each kind of statement is told apart: the hold's sets dead_reason by the horizon, the 410's
// sets it to 'gone'.
const isHold = (text: string) => text.includes("THEN 'horizon' ELSE dead_reason");
const isDisable = (text: string) => text.includes("dead_reason = 'gone'");

describe.skipIf(!available)("a 429's hold, or a 410's dead-lettering, on a URL with a large backlog", () => {
  const pool = testPool({ max: 4 });
  const table = uniqueTable('hold_batches');
  const outbox = createOutbox({ table });
  const closers: Array<() => Promise<void>> = [];
  let url = '';

  beforeAll(async () => {
    await outbox.migrate(pool);
    const endpoint = await startThrottlingEndpoint();
    closers.push(endpoint.close);
    url = endpoint.url;
  });
  afterAll(async () => {
    for (const close of closers.reverse()) await close().catch(() => undefined);
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });
  beforeEach(async () => {
    await pool.query(`DELETE FROM "${table}"`);
  });

  // `evt_due`, due first (a round of one claims it), then `count` rows of the URL, due in id order.
  const seed = async (
    target: string,
    count: number,
    nextAttemptAt = `now() - interval '1 minute' + n * interval '1 ms'`,
  ) => {
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, next_attempt_at)
       VALUES ('evt_due', $1, convert_to('{}', 'UTF8'), now() - interval '1 hour')`,
      [target],
    );
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, next_attempt_at)
       SELECT 'evt_' || lpad(n::text, 5, '0'), $1, convert_to('{}', 'UTF8'), ${nextAttemptAt}
         FROM generate_series(1, $2::int) AS n`,
      [target, count],
    );
  };

  // A pool that records the rows each hold (or 410) statement wrote, and can pause after each.
  const watched = (
    pick: (text: string) => boolean,
    after: (batch: number) => Promise<void> | void = () => undefined,
  ) => {
    const batches: number[] = [];
    const db: Queryable = {
      query: async (text, values) => {
        const result = await pool.query(text, values);
        if (pick(text)) {
          batches.push(result.rowCount ?? 0);
          await after(batches.length);
        }
        return result;
      },
    };
    return { db, batches };
  };

  const heldPastFiftySeconds = async () =>
    (
      await pool.query(
        `SELECT count(*)::int AS n FROM "${table}" WHERE status = 'pending' AND next_attempt_at > now() + interval '50 seconds'`,
      )
    ).rows[0].n as number;

  const sender = createSender({ secret: SECRET, timeout: '2s', random: () => 0.5 });

  it('rewrites at most 1,000 rows per statement', async () => {
    await seed(url, 2999);
    const { db, batches } = watched(isHold);
    expect(await outbox.relay({ db, sender, batchSize: 1, lease: '10s' }).runOnce()).toMatchObject({ retrying: 1 });
    expect(await heldPastFiftySeconds()).toBe(3000);
    expect(batches).toEqual([1000, 1000, 999]);
  });

  it('leaves rows already put off to within the slack alone, in one statement', async () => {
    // The 60 s the endpoint asks, less half a second: within the second of slack.
    await seed(url, 2500, `now() + interval '59.5 seconds'`);
    const before = await pool.query(`SELECT id, next_attempt_at FROM "${table}" WHERE id <> 'evt_due' ORDER BY id`);
    const { db, batches } = watched(isHold);
    expect(await outbox.relay({ db, sender, batchSize: 1, lease: '10s' }).runOnce()).toMatchObject({ retrying: 1 });
    expect(batches).toEqual([0]);
    const after = await pool.query(`SELECT id, next_attempt_at FROM "${table}" WHERE id <> 'evt_due' ORDER BY id`);
    expect(after.rows).toEqual(before.rows);
  });

  it('holds each row once, however long its batches take: a held row is not picked again', async () => {
    // The batches are spread over more than the second of slack: a batch whose hold ended later than
    // the first one's by more than that found the rows held first due before its own end again.
    await seed(url, 3499);
    const { db, batches } = watched(isHold, () => sleep(600));
    expect(await outbox.relay({ db, sender, batchSize: 1, lease: '20s' }).runOnce()).toMatchObject({ retrying: 1 });
    expect(batches).toEqual([1000, 1000, 1000, 499]);
    expect(await heldPastFiftySeconds()).toBe(3500);
    // Every batch held its rows to the same end: the answer's, by the database's clock.
    const ends = await pool.query(
      `SELECT count(DISTINCT next_attempt_at)::int AS n FROM "${table}" WHERE id <> 'evt_due'`,
    );
    expect(ends.rows[0].n).toBe(1);
  });

  it('leaves the rows other relays hold leased, in every batch', async () => {
    await seed(url, 2400);
    // Every third row is in flight with another relay; every seventh was, and that relay died.
    await pool.query(
      `UPDATE "${table}" SET locked_by = 'other', claims = 1, attempts = 1, locked_until = now() + interval '1 minute'
        WHERE id <> 'evt_due' AND substr(id, 5)::int % 3 = 0`,
    );
    await pool.query(
      `UPDATE "${table}" SET locked_by = 'dead', claims = 1, attempts = 1, locked_until = now() - interval '1 second'
        WHERE id <> 'evt_due' AND substr(id, 5)::int % 3 <> 0 AND substr(id, 5)::int % 7 = 0`,
    );
    const leased = await pool.query(
      `SELECT id, next_attempt_at, locked_until FROM "${table}" WHERE locked_by = 'other' ORDER BY id`,
    );
    const { db, batches } = watched(isHold);
    expect(await outbox.relay({ db, sender, batchSize: 1, lease: '10s' }).runOnce()).toMatchObject({ retrying: 1 });
    expect(batches).toEqual([1000, 600]);
    const still = await pool.query(
      `SELECT id, next_attempt_at, locked_until FROM "${table}" WHERE locked_by = 'other' ORDER BY id`,
    );
    expect(still.rows).toEqual(leased.rows);
    expect(still.rows).toHaveLength(800);
    expect(await heldPastFiftySeconds()).toBe(1601);
  });

  it('dead-letters a row past its horizon in a later batch, counts it, and records its lost attempt', async () => {
    await seed(url, 2500);
    // The last rows due (so in the third batch), attempted before, whose hour-long horizon ends
    // within the minute of the hold; one of them was claimed by a relay that died.
    await pool.query(
      `UPDATE "${table}" SET attempts = 2, created_at = now() - interval '59 minutes 30 seconds'
        WHERE id BETWEEN 'evt_02496' AND 'evt_02500'`,
    );
    await pool.query(
      `UPDATE "${table}" SET locked_by = 'dead', claims = 3, attempts = 3, locked_until = now() - interval '1 second'
        WHERE id = 'evt_02500'`,
    );
    const hourly = createSender({ secret: SECRET, timeout: '2s', random: () => 0.5, schedule: { horizon: '1h' } });
    const { db, batches } = watched(isHold);
    expect(await outbox.relay({ db, sender: hourly, batchSize: 1, lease: '10s' }).runOnce()).toMatchObject({
      claimed: 1,
      retrying: 1,
      dead: 5,
    });
    expect(batches).toEqual([1000, 1000, 500]);
    const dead = await pool.query(
      `SELECT id, dead_reason, locked_by, history FROM "${table}" WHERE status = 'dead' ORDER BY id`,
    );
    expect(dead.rows.map((row) => [row.id, row.dead_reason, row.locked_by])).toEqual(
      ['evt_02496', 'evt_02497', 'evt_02498', 'evt_02499', 'evt_02500'].map((id) => [id, 'horizon', null]),
    );
    expect(dead.rows[4].history).toMatchObject([{ attempt: 3, result: 'lost', claim: 3, relayId: 'dead' }]);
    expect(await heldPastFiftySeconds()).toBe(2496);
  });

  it("dead-letters a 410's URL in batches of at most 1,000 rows, every waiting row in the end", async () => {
    const server = createServer((request, response) => {
      request.resume();
      request.on('end', () => response.writeHead(410).end());
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    closers.push(
      () =>
        new Promise<void>((resolve) => {
          server.closeAllConnections();
          server.close(() => resolve());
        }),
    );
    const gone = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
    await seed(gone, 2600);
    await pool.query(
      `UPDATE "${table}" SET locked_by = 'other', claims = 1, attempts = 1, locked_until = now() + interval '1 minute'
        WHERE id IN ('evt_00001', 'evt_01500')`,
    );
    const { db, batches } = watched(isDisable);
    expect(await outbox.relay({ db, sender, batchSize: 1, lease: '10s' }).runOnce()).toMatchObject({
      claimed: 1,
      dead: 2599,
    });
    expect(batches).toEqual([1000, 1000, 598]);
    const left = await pool.query(`SELECT id FROM "${table}" WHERE status <> 'dead' ORDER BY id`);
    expect(left.rows.map((row) => row.id)).toEqual(['evt_00001', 'evt_01500']);
  });

  it('starts no batch once stop() was called: the rows left are held by a later answer', async () => {
    await seed(url, 2999);
    let stopped: Promise<void> | undefined;
    const { db, batches } = watched(isHold, (batch) => {
      if (batch === 1) stopped = relay.stop();
    });
    const relay = outbox.relay({ db, sender, batchSize: 1, lease: '10s', pollInterval: '10s' });
    relay.start();
    await expect.poll(() => stopped !== undefined, { timeout: 5_000 }).toBe(true);
    await stopped;
    expect(batches).toEqual([1000]);
    expect(await heldPastFiftySeconds()).toBe(1001);
  });

  it("starts no batch once three quarters of the round's lease have passed: the round ends within it", async () => {
    await seed(url, 9999);
    const errors: unknown[] = [];
    const { db, batches } = watched(isHold, () => sleep(1_000));
    const relay = outbox.relay({ db, sender, batchSize: 1, lease: '4s', onError: (error) => errors.push(error) });
    expect(await relay.runOnce()).toMatchObject({ retrying: 1 });
    expect(errors).toEqual([]);
    // A batch, a second's pause, and so on: the third (or, on a slow machine, the second) ends past 3 s.
    expect(batches.length).toBeGreaterThanOrEqual(2);
    expect(batches.length).toBeLessThanOrEqual(3);
    expect(await heldPastFiftySeconds()).toBe(1 + 1000 * batches.length);
  });
});
