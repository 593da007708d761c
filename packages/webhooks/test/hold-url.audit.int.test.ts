// Audit of the relay's hold on a throttling URL (holdUrl in packages/webhooks/src/relay-url-writes.ts): a 429,
// or any answer with a Retry-After, puts the URL's other waiting rows off. Real PostgreSQL (a table
// of its own), a real endpoint on an ephemeral port, one relay round at a time (`runOnce`); waits are
// read from next_attempt_at by the database's clock, never waited out.
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('hold-url audit');

async function endpoint(handler: (request: IncomingMessage, response: ServerResponse) => void) {
  let count = 0;
  const server = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      count++;
      handler(request, response);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`,
    count: () => count,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

type HeldRow = { id: string; attempts: number; claims: number; locked_by: string | null; s: number };

describe.skipIf(!available)('the relay holds a throttling URL', () => {
  const pool = testPool({ max: 4 });
  const table = uniqueTable('hold');
  const outbox = createOutbox({ table });
  const closers: Array<() => Promise<unknown>> = [];

  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  afterAll(async () => {
    for (const close of closers.reverse()) await close().catch(() => undefined);
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  // `old`: one event deep in its retries (`attempts` done), due first; then `fresh` events, never tried.
  const seed = async (url: string, attempts: number, fresh: number) => {
    await pool.query(`DELETE FROM "${table}"`);
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, attempts, next_attempt_at)
       VALUES ('evt_old', $1, convert_to('{}', 'UTF8'), $2, now() - interval '1 minute')`,
      [url, attempts],
    );
    await pool.query(
      `INSERT INTO "${table}" (id, url, body) SELECT 'evt_fresh_' || n, $1, convert_to('{}', 'UTF8')
         FROM generate_series(1, $2::int) AS n`,
      [url, fresh],
    );
  };
  // The pool, but the statements that contain `marker` meet a database that went away.
  const failingOn = (marker: string) => ({
    query: (text: string, values?: unknown[]) =>
      text.includes(marker)
        ? Promise.reject(Object.assign(new Error('terminating connection'), { code: '57P01' }))
        : pool.query(text, values),
  });
  // How far the never-tried events were put off, in seconds from now (by the database's clock).
  const freshHeldFor = async () =>
    (
      await pool.query(
        `SELECT extract(epoch FROM next_attempt_at - now())::float8 AS s FROM "${table}"
          WHERE id LIKE 'evt_fresh_%' ORDER BY s`,
      )
    ).rows.map((row: { s: number }) => row.s);

  // Was wrong: only an answered row that went on waiting held its URL; one answered 429 on its last
  // attempt (dead-lettered, max-attempts) held nothing, though the endpoint asked all the same.
  it('a 429 on an event’s last attempt still holds the URL’s other events', async () => {
    const throttled = await endpoint((_request, response) => {
      response.writeHead(429, { 'retry-after': '120' });
      response.end();
    });
    closers.push(throttled.close);
    await seed(throttled.url, 2, 2);
    const sender = createSender({ secret: SECRET, timeout: '2s', schedule: { maxAttempts: 3 }, random: () => 0.5 });
    const relay = outbox.relay({ db: pool, sender, batchSize: 1, lease: '5s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, dead: 1 });
    const held = await freshHeldFor();
    expect(held).toHaveLength(2);
    for (const seconds of held) expect(seconds).toBeGreaterThan(110);
  });

  it('a hold that fails is told to onError and fails nothing else: the answered event is recorded, the others are tried sooner', async () => {
    const throttled = await endpoint((_request, response) => {
      response.writeHead(429, { 'retry-after': '120' });
      response.end();
    });
    closers.push(throttled.close);
    await seed(throttled.url, 0, 2);
    const errors: unknown[] = [];
    // The hold's statement alone meets a failing database.
    const db = failingOn("THEN 'horizon' ELSE dead_reason");
    const sender = createSender({ secret: SECRET, timeout: '2s', random: () => 0.5 });
    const relay = outbox.relay({ db, sender, batchSize: 1, lease: '5s', onError: (error) => errors.push(error) });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    expect(errors).toMatchObject([{ code: '57P01' }]);
    const [old] = (await pool.query(`SELECT last_attempt FROM "${table}" WHERE id = 'evt_old'`)).rows;
    expect(old.last_attempt).toMatchObject({ status: 429 });
    for (const seconds of await freshHeldFor()) expect(seconds).toBeLessThanOrEqual(0);
  });

  // Was wrong: the 410's dead-lettering of the URL's other events threw, and the round rejected
  // though the answered event was recorded (its result then missing from the round, and, with
  // batches, the rows a first batch dead-lettered too); a hold that fails was already reported only.
  it('a 410 whose dead-lettering of the others fails is told to onError: the round ends, the others stay to find out', async () => {
    const gone = await endpoint((_request, response) => {
      response.writeHead(410);
      response.end();
    });
    closers.push(gone.close);
    await seed(gone.url, 0, 2);
    const errors: unknown[] = [];
    const db = failingOn("dead_reason = 'gone', locked_until = NULL, locked_by = NULL,");
    const sender = createSender({ secret: SECRET, timeout: '2s', random: () => 0.5 });
    const relay = outbox.relay({ db, sender, batchSize: 1, lease: '5s', onError: (error) => errors.push(error) });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, dead: 1 });
    expect(errors).toMatchObject([{ code: '57P01' }]);
    const rows = (await pool.query(`SELECT id, status FROM "${table}" ORDER BY id`)).rows;
    expect(rows).toEqual([
      { id: 'evt_fresh_1', status: 'pending' },
      { id: 'evt_fresh_2', status: 'pending' },
      { id: 'evt_old', status: 'dead' },
    ]);
  });

  it('a Retry-After past maxRetryAfter holds the URL for the cap, not for what was asked', async () => {
    const throttled = await endpoint((_request, response) => {
      response.writeHead(429, { 'retry-after': '999999' });
      response.end();
    });
    closers.push(throttled.close);
    await seed(throttled.url, 0, 3);
    const sender = createSender({
      secret: SECRET,
      timeout: '2s',
      schedule: { base: '1s', cap: '1h', maxRetryAfter: '10m' },
      random: () => 0.5,
    });
    const relay = outbox.relay({ db: pool, sender, batchSize: 1, lease: '5s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    const held = await freshHeldFor();
    expect(held).toHaveLength(3);
    for (const seconds of held) {
      expect(seconds).toBeGreaterThan(590);
      expect(seconds).toBeLessThanOrEqual(600);
    }
    expect(throttled.count()).toBe(1);
  });

  it('a crashed row (lease over) is held without touching its claim; a row leased to a live claim is left alone', async () => {
    const throttled = await endpoint((_request, response) => {
      response.writeHead(429, { 'retry-after': '120' });
      response.end();
    });
    closers.push(throttled.close);
    await seed(throttled.url, 0, 0);
    // Another relay's claims: one whose lease ran out (it died mid-attempt), one still live.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, attempts, claims, locked_by, locked_until, next_attempt_at) VALUES
         ('evt_crashed', $1, convert_to('{}', 'UTF8'), 1, 1, 'relay-dead', now() - interval '1 second', now() - interval '10 seconds'),
         ('evt_leased', $1, convert_to('{}', 'UTF8'), 1, 1, 'relay-live', now() + interval '1 minute', now() - interval '10 seconds')`,
      [throttled.url],
    );
    const sender = createSender({ secret: SECRET, timeout: '2s', schedule: { base: '1s' }, random: () => 0.5 });
    const relay = outbox.relay({ db: pool, sender, batchSize: 1, lease: '5s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    const byId = Object.fromEntries(
      (
        await pool.query(
          `SELECT id, attempts, claims, locked_by, extract(epoch FROM next_attempt_at - now())::float8 AS s
             FROM "${table}" WHERE id IN ('evt_crashed', 'evt_leased')`,
        )
      ).rows.map((row: HeldRow) => [row.id, row]),
    ) as Record<'evt_crashed' | 'evt_leased', HeldRow>;
    // Held as long as the answered row waits; its claim untouched, so a late result of that claim
    // still passes the fence, and a takeover still finds it crashed.
    expect(byId.evt_crashed).toMatchObject({ attempts: 1, claims: 1, locked_by: 'relay-dead' });
    expect(byId.evt_crashed.s).toBeGreaterThan(110);
    // In flight with a live claim: left to it.
    expect(byId.evt_leased).toMatchObject({ attempts: 1, claims: 1, locked_by: 'relay-live' });
    expect(byId.evt_leased.s).toBeLessThan(0);
    expect(throttled.count()).toBe(1);
  });

  // Was wrong: a hold that put a row's next attempt past its horizon left it pending, where the row's
  // own wait ending past the horizon dead-letters it at once ('horizon', `ending` in relay-results.ts): it
  // sat until the hold ended and the claim that found it dead-lettered it without an attempt, up to
  // `maxRetryAfter` late. Decided: the hold dead-letters such a row (one already attempted) at once.
  it('a row the hold puts past its horizon is dead-lettered at once, as its own wait would', async () => {
    const throttled = await endpoint((_request, response) => {
      response.writeHead(429, { 'retry-after': '120' });
      response.end();
    });
    closers.push(throttled.close);
    await seed(throttled.url, 0, 0);
    // Tried once, 10 s before its 1 h horizon ends, waiting for its next attempt in 1 s.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, attempts, claims, created_at, next_attempt_at)
       VALUES ('evt_late', $1, convert_to('{}', 'UTF8'), 1, 1,
               now() - interval '59 minutes 50 seconds', now() + interval '1 second')`,
      [throttled.url],
    );
    const sender = createSender({
      secret: SECRET,
      timeout: '2s',
      schedule: { base: '1s', horizon: '1h' },
      random: () => 0.5,
    });
    const relay = outbox.relay({ db: pool, sender, batchSize: 1, lease: '5s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    const [late] = (
      await pool.query(
        `SELECT status, dead_reason, extract(epoch FROM next_attempt_at - now())::float8 AS s
           FROM "${table}" WHERE id = 'evt_late'`,
      )
    ).rows;
    expect(late).toMatchObject({ status: 'dead', dead_reason: 'horizon' });
  });

  // Found untested by a mutation pass (the hold without `status !== 'fenced'` changed no test): a claim
  // fenced off while its attempt ran holds nothing, whatever the endpoint answered it. The claim that
  // took the row over decides, with an answer of its own.
  it('a fenced claim answered 429 holds none of the URL’s other events', async () => {
    const throttled = await endpoint(async (_request, response) => {
      // Taken over while the attempt runs: another relay's claim, with a lease of its own.
      await pool.query(
        `UPDATE "${table}" SET claims = claims + 1, attempts = attempts + 1, locked_by = 'other',
                locked_until = now() + interval '1 minute' WHERE id = 'evt_old'`,
      );
      response.writeHead(429, { 'retry-after': '120' });
      response.end();
    });
    closers.push(throttled.close);
    await seed(throttled.url, 0, 3);
    const sender = createSender({ secret: SECRET, timeout: '2s', schedule: { base: '1s' }, random: () => 0.5 });
    const relay = outbox.relay({ db: pool, sender, batchSize: 1, lease: '5s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, fenced: 1 });
    expect(throttled.count()).toBe(1);
    for (const s of await freshHeldFor()) expect(s).toBeLessThanOrEqual(0);
  });

  // Found untested by a mutation pass (pastHorizon without `attempts >= 1` changed no test): the hold
  // dead-letters only a row already attempted. A row never tried gets its first attempt however late
  // it is (the claim's rule too), so the hold only puts it off.
  it('a row never attempted is held, not dead-lettered, though the hold ends past its horizon', async () => {
    const throttled = await endpoint((_request, response) => {
      response.writeHead(429, { 'retry-after': '120' });
      response.end();
    });
    closers.push(throttled.close);
    await seed(throttled.url, 0, 0);
    // Never tried, 10 s before its 1 h horizon ends, due in 1 s.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, created_at, next_attempt_at)
       VALUES ('evt_never', $1, convert_to('{}', 'UTF8'),
               now() - interval '59 minutes 50 seconds', now() + interval '1 second')`,
      [throttled.url],
    );
    const sender = createSender({
      secret: SECRET,
      timeout: '2s',
      schedule: { base: '1s', horizon: '1h' },
      random: () => 0.5,
    });
    const relay = outbox.relay({ db: pool, sender, batchSize: 1, lease: '5s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1, dead: 0 });
    const [never] = (
      await pool.query(
        `SELECT status, dead_reason, attempts, extract(epoch FROM next_attempt_at - now())::float8 AS s
           FROM "${table}" WHERE id = 'evt_never'`,
      )
    ).rows;
    expect(never).toMatchObject({ status: 'pending', dead_reason: null, attempts: 0 });
    expect(never.s).toBeGreaterThan(100);
  });

  // Was wrong: the hold was the answered event's own wait, which is its backoff whenever that is
  // longer than the Retry-After: an event deep in its retries (backoff near the 1 h cap) that met
  // `429, Retry-After: 5` put every fresh event of the URL off for its half hour, though the endpoint
  // asked for 5 s. Decided: the others wait as if each had been answered the same on a first attempt
  // (`sender.nextDelay(1, retryAfter)`: the capped Retry-After, or a first retry's backoff).
  it('a Retry-After of 5 s from an event deep in its backoff holds the fresh events as a first retry waits, not its half hour', async () => {
    const throttled = await endpoint((_request, response) => {
      response.writeHead(429, { 'retry-after': '5' });
      response.end();
    });
    closers.push(throttled.close);
    // Its 7th attempt: the backoff before the next is min(1 h, 1 min × 2^6) × 0.5 = 30 min.
    await seed(throttled.url, 6, 3);
    const sender = createSender({
      secret: SECRET,
      timeout: '2s',
      schedule: { base: '1m', cap: '1h' },
      random: () => 0.5,
    });
    const relay = outbox.relay({ db: pool, sender, batchSize: 1, lease: '5s' });
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    const [old] = (await pool.query(`SELECT last_attempt FROM "${table}" WHERE id = 'evt_old'`)).rows;
    expect(old.last_attempt.waitMs).toBe(1_800_000);
    const held = await freshHeldFor();
    expect(held).toHaveLength(3);
    // As a first retry of each would wait: max(its backoff, 1 min × 0.5, and the 5 s asked) = 30 s.
    for (const seconds of held) {
      expect(seconds).toBeGreaterThan(25);
      expect(seconds).toBeLessThanOrEqual(30);
    }
  });
});
