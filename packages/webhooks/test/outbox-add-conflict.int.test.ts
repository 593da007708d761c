// outbox.add() of an id the outbox already holds with another event (another body, url, content type
// or headers). Adding nothing and answering `added: false` would tell the producer its event was
// queued while it is lost; the same event again stays a no-op, which is what the id is for. The
// anchors do not catch it either (research events-anchors.md, "Same id, different body": BullMQ
// ignores a duplicate jobId, pg-boss and graphile-worker do not check; Svix answers 409 to a repeated
// eventId; Powertools checks a payload hash, as @idem/core's fingerprint_mismatch does).
import type { PoolClient } from 'pg';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createOutbox, isWebhookError, type Outbox, type OutboxEvent } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const available = await postgresAvailable('outbox add conflict');

describe.skipIf(!available)('outbox.add of an id the outbox holds with another event', () => {
  const pool = testPool();
  const table = uniqueTable('outbox_conflict');
  const outbox: Outbox = createOutbox({ table });
  const event: OutboxEvent = {
    id: 'evt_1',
    url: 'https://receiver.test/hooks',
    body: { type: 'order.paid', order: 1 },
    contentType: 'application/json',
    headers: { 'x-tenant': 't1', 'x-region': 'eu' },
  };
  const stored = async () =>
    (
      await pool.query(
        `SELECT id, url, convert_from(body, 'UTF8') AS body, content_type, headers FROM "${table}" ORDER BY id`,
      )
    ).rows;
  const reused = (error: unknown) => isWebhookError(error) && error.code === 'event_id_reused';
  // Runs `work` in a transaction on its own client; a failed expectation rolls it back, so the client
  // goes back to the pool without a transaction open.
  const inTransaction = async (work: (client: PoolClient) => Promise<void>) => {
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await work(client);
      await client.query('COMMIT');
    } catch (error) {
      await client.query('ROLLBACK');
      throw error;
    } finally {
      client.release();
    }
  };

  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  beforeEach(async () => {
    await pool.query(`DELETE FROM "${table}"`);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  it('the same event again is a no-op: the same bytes, url, content type and headers (in any key order)', async () => {
    expect(await outbox.add(pool, event)).toEqual({ id: 'evt_1', added: true });
    expect(await outbox.add(pool, { ...event, headers: { 'x-region': 'eu', 'x-tenant': 't1' } })).toEqual({
      id: 'evt_1',
      added: false,
    });
    // The object body is sent as its JSON: the same JSON as a string is the same event.
    expect(await outbox.add(pool, { ...event, body: '{"type":"order.paid","order":1}' })).toEqual({
      id: 'evt_1',
      added: false,
    });
    expect(await stored()).toHaveLength(1);
  });

  it.each([
    ['body', { body: { type: 'order.paid', order: 2 } }],
    ['url', { url: 'https://other.test/hooks' }],
    ['content type', { contentType: 'application/cloudevents+json' }],
    ['headers', { headers: { 'x-tenant': 't2', 'x-region': 'eu' } }],
    ['headers (one less)', { headers: { 'x-tenant': 't1' } }],
  ])(
    'another %s under a committed id is refused with event_id_reused, and the first event stays',
    async (_, change) => {
      await outbox.add(pool, event);
      const before = await stored();
      await inTransaction(async (client) => {
        const error = await outbox.add(client, { ...event, ...change }).catch((caught: unknown) => caught);
        expect(reused(error)).toBe(true);
        expect(error).toMatchObject({ status: 422, retryable: false, details: { id: 'evt_1' } });
        // Refused by the outbox, not by PostgreSQL: the caller's transaction is not aborted, and decides.
        expect((await client.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
      });
      expect(await stored()).toEqual(before);
    },
  );

  it('refused inside the transaction that added the first event too', async () => {
    await inTransaction(async (client) => {
      expect(await outbox.add(client, event)).toEqual({ id: 'evt_1', added: true });
      expect(await outbox.add(client, event)).toEqual({ id: 'evt_1', added: false });
      const error = await outbox.add(client, { ...event, body: 'changed' }).catch((caught: unknown) => caught);
      expect(reused(error)).toBe(true);
    });
    expect(await stored()).toEqual([expect.objectContaining({ id: 'evt_1', body: '{"type":"order.paid","order":1}' })]);
  });

  it('the error carries no payload: not the body, not the headers', async () => {
    await outbox.add(pool, { ...event, body: 'secret-first-body' });
    const error = await outbox
      .add(pool, { ...event, body: 'secret-second-body', headers: { authorization: 'Bearer secret-token' } })
      .catch((caught: unknown) => caught);
    expect(reused(error)).toBe(true);
    expect(JSON.stringify({ ...(error as object), message: (error as Error).message })).not.toMatch(/secret/);
  });

  // Two producers on their own connections, with no order between them: PostgreSQL decides which
  // insert is first. Exactly one adds its event; the other is told, never `added: false`.
  it('two concurrent adds of one id with different bodies: exactly one wins, the other gets event_id_reused', async () => {
    const rounds = 40;
    for (let round = 0; round < rounds; round++) {
      const id = `evt_race_${round}`;
      const results = await Promise.allSettled([
        outbox.add(pool, { ...event, id, body: 'first' }),
        outbox.add(pool, { ...event, id, body: 'second' }),
      ]);
      const added = results.filter((result) => result.status === 'fulfilled');
      const refused = results.filter((result) => result.status === 'rejected');
      expect(added.map((result) => result.value)).toEqual([{ id, added: true }]);
      expect(refused.map((result) => reused(result.reason))).toEqual([true]);
      const winner = results[0]?.status === 'fulfilled' ? 'first' : 'second';
      expect(
        (await pool.query(`SELECT convert_from(body, 'UTF8') AS body FROM "${table}" WHERE id = $1`, [id])).rows,
      ).toEqual([{ body: winner }]);
    }
  });
});
