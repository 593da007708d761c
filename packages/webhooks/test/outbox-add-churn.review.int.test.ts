// outbox.add() of an id that another process keeps adding and deleting (a producer re-adding it,
// purge() or a delete of its own removing it) while add() looks at it. add() tries the insert three times: each
// time the id is taken when it inserts and gone when it looks at the row. It then gives up, having
// added nothing; what it throws is matched on by the caller, so it needs a stable code like every
// other error of the package, not a plain Error whose only handle is its message.
// (The look at the row is told by its `AS same` verdict column.)
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, isWebhookError, type Outbox, type Queryable } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const available = await postgresAvailable('outbox add churn');

describe.skipIf(!available)('outbox.add of an id deleted under it each time it looks', () => {
  const pool = testPool();
  const table = uniqueTable('outbox_churn');
  const outbox: Outbox = createOutbox({ table });
  const url = 'https://receiver.test/hooks';

  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  it('gives up with a WebhookError of a stable code, retryable, adds nothing and leaves the transaction usable', async () => {
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      // The real transaction, with another connection's committed work between its statements: the
      // id is added (by another producer) before each insert, and deleted before each look at it.
      const churned: Queryable = {
        async query(text, values) {
          if (text.includes('INSERT INTO')) await outbox.add(pool, { id: 'evt_churn', url, body: 'theirs' });
          if (text.includes(' AS same')) await pool.query(`DELETE FROM "${table}" WHERE id = 'evt_churn'`);
          return client.query(text, values);
        },
      };
      const error = await outbox
        .add(churned, { id: 'evt_churn', url, body: 'mine' })
        .catch((thrown: unknown) => thrown);
      expect(isWebhookError(error), String(error)).toBe(true);
      expect(isWebhookError(error) && { code: error.code, retryable: error.retryable, details: error.details }).toEqual(
        {
          code: 'event_id_contended',
          retryable: true,
          details: { id: 'evt_churn' },
        },
      );
      // Nothing of this transaction's: its statements all succeeded, so it commits.
      expect((await client.query(`SELECT count(*)::int AS n FROM "${table}"`)).rows).toEqual([{ n: 0 }]);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
  });

  // docs/webhooks.md and docs/errors.md say "three times over": it gives up after the third look,
  // not the second (a purge racing one add twice is rare, three times is churn) nor the fourth.
  it('looks three times: churned twice, the third insert adds the event; churned every time, it stops at three', async () => {
    const attempt = async (id: string, churnTimes: number) => {
      const client = await pool.connect();
      let inserts = 0;
      try {
        await client.query('BEGIN');
        const churned: Queryable = {
          async query(text, values) {
            if (text.includes('INSERT INTO')) {
              inserts += 1;
              if (inserts <= churnTimes) await outbox.add(pool, { id, url, body: 'theirs' });
            }
            if (text.includes(' AS same') && inserts <= churnTimes) {
              await pool.query(`DELETE FROM "${table}" WHERE id = $1`, [id]);
            }
            return client.query(text, values);
          },
        };
        const outcome = await outbox.add(churned, { id, url, body: 'mine' }).then(
          (result) => result,
          (error: unknown) => (isWebhookError(error) ? error.code : error),
        );
        await client.query('COMMIT');
        return { outcome, inserts };
      } finally {
        client.release();
      }
    };
    expect(await attempt('evt_churn_twice', 2)).toEqual({
      outcome: { id: 'evt_churn_twice', added: true },
      inserts: 3,
    });
    expect(await attempt('evt_churn_always', Number.POSITIVE_INFINITY)).toEqual({
      outcome: 'event_id_contended',
      inserts: 3,
    });
  });
});
