// docs/webhooks.md claims about the outbox's add(), checked on the real PostgreSQL (docs audit of
// 2026-12): true claims that no test held.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, isWebhookError } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const available = await postgresAvailable('outbox docs claims');

describe.skipIf(!available)('docs/webhooks.md: a row is one event for one endpoint', () => {
  const pool = testPool();
  const tables = [uniqueTable('outbox_a'), uniqueTable('outbox_b')];
  const [first, second] = tables.map((table) => createOutbox({ table }));

  beforeAll(async () => {
    await first?.migrate(pool);
    await second?.migrate(pool);
  });
  afterAll(async () => {
    for (const table of tables) await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  // docs/webhooks.md, createOutbox's add(): "Another event under an id the outbox holds throws a
  // `WebhookError` `event_id_reused` (the transaction is not aborted ...). A row is one event for one
  // endpoint. To send one event, under one id, to several endpoints ... give each endpoint its own
  // outbox (`createOutbox({ table })`) and add the event to each in the same transaction."
  it('an id added again for another url is refused and keeps the first row; one outbox per endpoint takes the id in each', async () => {
    if (first === undefined || second === undefined) throw new Error('two outboxes');
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const event = { id: 'evt_shared', body: { type: 'order.paid' } };
      expect(await first.add(client, { ...event, url: 'https://a.example/hooks' })).toEqual({
        id: 'evt_shared',
        added: true,
      });
      const refused = await first.add(client, { ...event, url: 'https://b.example/hooks' }).catch((error) => error);
      expect(isWebhookError(refused) && refused.code).toBe('event_id_reused');
      expect(await second.add(client, { ...event, url: 'https://b.example/hooks' })).toEqual({
        id: 'evt_shared',
        added: true,
      });
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    const urls = async (table: string) =>
      (await pool.query(`SELECT id, url FROM "${table}" ORDER BY id`)).rows.map((row) => `${row.id} ${row.url}`);
    expect(await urls(tables[0] as string)).toEqual(['evt_shared https://a.example/hooks']);
    expect(await urls(tables[1] as string)).toEqual(['evt_shared https://b.example/hooks']);
  });
});
