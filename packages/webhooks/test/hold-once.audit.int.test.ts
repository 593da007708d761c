// Audit (volume): a relay round whose batch holds several rows of a URL that answers 429 (or any
// answer with a Retry-After) held the URL's other waiting rows once per answer: each hold came a few
// milliseconds after the one before, so its `now() + hold` was a little later, and every waiting
// row matched `next_attempt_at < until` again and was rewritten again. Measured on 90,000 waiting
// rows of one URL, a round of 10: 450,004 row versions written, a round of 36 s (past a default
// lease of 30 s), and the other relays' claims up to 0.7 s slower while the 90,000 rows stayed
// locked. Here a trigger counts the row versions written for 500 waiting rows.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender } from '../src/index.js';
import { startThrottlingEndpoint } from './support/endpoint.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('hold-once audit');

describe.skipIf(!available)('a round of several 429s from one URL', () => {
  const pool = testPool({ max: 8 });
  const table = uniqueTable('hold_once');
  const outbox = createOutbox({ table });
  let endpoint: Awaited<ReturnType<typeof startThrottlingEndpoint>>;
  let url = '';

  beforeAll(async () => {
    await outbox.migrate(pool);
    // Every row version written for a waiting row, counted by the database itself.
    await pool.query(`CREATE TABLE "${table}_writes" (id text NOT NULL)`);
    await pool.query(`
      CREATE FUNCTION "${table}_count"() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN INSERT INTO "${table}_writes" VALUES (NEW.id); RETURN NEW; END $$`);
    await pool.query(`
      CREATE TRIGGER counted BEFORE UPDATE ON "${table}" FOR EACH ROW
        WHEN (NEW.id LIKE 'evt_wait_%') EXECUTE FUNCTION "${table}_count"()`);
    endpoint = await startThrottlingEndpoint();
    url = endpoint.url;
  });
  afterAll(async () => {
    await endpoint.close();
    await pool.query(`DROP TABLE IF EXISTS "${table}", "${table}_writes"`);
    await pool.query(`DROP FUNCTION IF EXISTS "${table}_count"()`);
    await pool.end();
  });

  it('holds each waiting row of the URL once, however many of its rows the round had answered', async () => {
    // Five rows due first (the round's batch), then 500 waiting behind them.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, next_attempt_at)
       SELECT 'evt_due_' || n, $1, convert_to('{}', 'UTF8'), now() - interval '1 minute' FROM generate_series(1, 5) AS n`,
      [url],
    );
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, next_attempt_at)
       SELECT 'evt_wait_' || n, $1, convert_to('{}', 'UTF8'), now() - interval '10 seconds' FROM generate_series(1, 500) AS n`,
      [url],
    );
    const sender = createSender({ secret: SECRET, timeout: '2s', random: () => 0.5 });
    const round = await outbox.relay({ db: pool, sender, batchSize: 5, maxPerUrl: 5, lease: '10s' }).runOnce();
    expect(round).toMatchObject({ claimed: 5, retrying: 5 });

    // Every waiting row was put off for the minute the endpoint asked...
    const held = await pool.query(
      `SELECT min(extract(epoch FROM next_attempt_at - now()))::float8 AS s FROM "${table}" WHERE id LIKE 'evt_wait_%'`,
    );
    expect(held.rows[0].s).toBeGreaterThan(55);
    // ...by one write each.
    const writes = await pool.query(`SELECT count(*)::int AS n FROM "${table}_writes"`);
    expect(writes.rows[0].n).toBe(500);
  });
});
