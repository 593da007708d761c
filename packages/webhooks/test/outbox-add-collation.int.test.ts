// outbox.add() compares header names case-insensitively, in SQL. HTTP field names are ASCII, and the
// sender lower-cases them in JavaScript (ASCII rules whatever the locale); the compare must agree with
// it whatever the database's collation. PostgreSQL's lower() follows the collation: in a Turkish one
// it turns `I` into a dotless `ı`, so `X-ID` and `x-id` compared as two names, and a stored
// `Webhook-ID` was not recognised as the signer's header the sender replaces. A producer retrying its
// own event was told `event_id_reused`. The database here is a real one made with an ICU Turkish locale.
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, type OutboxEvent } from '../src/index.js';
import { databaseUrl, postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const available = await postgresAvailable('outbox add collation');

describe.skipIf(!available)('outbox.add in a database with a Turkish collation', () => {
  const admin = testPool({ max: 1 });
  const name = `idem_wh_tr_${randomBytes(4).toString('hex')}`;
  const url = new URL(databaseUrl);
  url.pathname = `/${name}`;
  const pool = testPool({ connectionString: url.href });
  const table = uniqueTable('outbox_collation');
  const outbox = createOutbox({ table });
  const event: OutboxEvent = { id: 'evt_1', url: 'https://receiver.test/hooks', body: '{"n":1}' };

  beforeAll(async () => {
    await admin.query(
      `CREATE DATABASE ${name} TEMPLATE template0 ENCODING 'UTF8' LOCALE_PROVIDER icu ICU_LOCALE 'tr-TR' LOCALE 'C.UTF-8'`,
    );
    // The premise: this database's lower() is not ASCII's.
    const { rows } = await pool.query(`SELECT lower('I') AS lowered`);
    expect(rows[0].lowered).toBe('ı');
    await outbox.migrate(pool);
  });
  afterAll(async () => {
    await pool.end();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.end();
  });

  it('a name with an I in another case is the same event', async () => {
    expect(await outbox.add(pool, { ...event, headers: { 'X-ID': 'a' } })).toEqual({ id: 'evt_1', added: true });
    expect(await outbox.add(pool, { ...event, headers: { 'x-id': 'a' } })).toEqual({ id: 'evt_1', added: false });
  });

  // add() refuses a Webhook-ID now (a TypeError); a row an earlier version stored may still hold one.
  it('a Webhook-ID the sender replaces with its own is left out of the compare, as webhook-id is', async () => {
    const id = 'evt_2';
    await pool.query(
      `INSERT INTO "${table}" (id, url, body, content_type, headers)
       VALUES ($1, $2, convert_to('{"n":1}', 'UTF8'), 'application/json', '{"Webhook-ID": "x"}'::jsonb)`,
      [id, event.url],
    );
    expect(await outbox.add(pool, { ...event, id })).toEqual({ id, added: false });
  });
});
