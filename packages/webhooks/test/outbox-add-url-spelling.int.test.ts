// outbox.add() and two spellings of one URL. The url is stored and compared as its text: a `URL`
// object as its href (host lower-cased, default port dropped), a string as given. fetch parses
// both to the same request, so a producer that retries with the other spelling sends the same
// event, yet add() refuses it; and the relay's per-URL share, its hold after a 429 and its
// dead-lettering after a 410 count the two spellings as two endpoints.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const available = await postgresAvailable('outbox add url spelling');

describe.skipIf(!available)('outbox.add and two spellings of one URL', () => {
  const pool = testPool();
  const table = uniqueTable('outbox_url_spelling');
  const outbox = createOutbox({ table });

  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  // Was wrong: a string URL and the same URL as a `URL` object (or `Receiver.test:443` and
  // `receiver.test`) are one endpoint to fetch but two events to add() (event_id_reused); needs a
  // decision: storing the WHATWG href changes the text the per-URL share, hold and 410 group by,
  // and rows stored by earlier versions hold the unparsed text, which SQL cannot parse to compare.
  it.fails('a retry that spells the URL as fetch would parse it is the same event', async () => {
    const event = { id: 'evt_url', body: '{"n":1}' };
    expect(await outbox.add(pool, { ...event, url: 'https://Receiver.test:443/hooks' })).toEqual({
      id: 'evt_url',
      added: true,
    });
    expect(await outbox.add(pool, { ...event, url: new URL('https://Receiver.test:443/hooks') })).toEqual({
      id: 'evt_url',
      added: false,
    });
  });
});
