// outbox.add() and two spellings of one URL. fetch parses a string and a `URL` object (or
// `Receiver.test:443` and `receiver.test`) to the same request: the outbox stores the href, so a
// producer that retries with the other spelling adds the same event, and the relay's per-URL share,
// hold after a 429 and dead-lettering after a 410 count one endpoint. Rows of earlier versions hold
// the text as spelt, and still match a retry spelt the same.
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

  it('a retry that spells the URL as fetch would parse it is the same event, stored as its href', async () => {
    const event = { id: 'evt_url', body: '{"n":1}' };
    expect(await outbox.add(pool, { ...event, url: 'https://Receiver.test:443/hooks' })).toEqual({
      id: 'evt_url',
      added: true,
    });
    expect(await outbox.add(pool, { ...event, url: new URL('https://Receiver.test:443/hooks') })).toEqual({
      id: 'evt_url',
      added: false,
    });
    expect(await outbox.add(pool, { ...event, url: 'https://receiver.test/hooks' })).toEqual({
      id: 'evt_url',
      added: false,
    });
    const { rows } = await pool.query(`SELECT url FROM "${table}" WHERE id = 'evt_url'`);
    expect(rows).toEqual([{ url: 'https://receiver.test/hooks' }]);
    await expect(outbox.add(pool, { ...event, url: 'https://receiver.test/other' })).rejects.toMatchObject({
      code: 'event_id_reused',
    });
  });

  it('a row an earlier version stored as spelt still matches a retry spelt the same', async () => {
    // Earlier versions stored String(url): the row is written here as they wrote it.
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, content_type, headers) VALUES ('evt_old', 'https://Receiver.test:443/hooks', $1, 'application/json', '{}')`,
      [Buffer.from('{"n":1}')],
    );
    expect(await outbox.add(pool, { id: 'evt_old', body: '{"n":1}', url: 'https://Receiver.test:443/hooks' })).toEqual({
      id: 'evt_old',
      added: false,
    });
  });
});
