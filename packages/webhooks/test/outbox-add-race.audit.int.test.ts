// Two producers add one event id at once, each in its own transaction on its own connection
// (graphile/worker#580: a job_key race under contention; pg-boss#492: a unique-key violation on a
// retry that halted the caller). The second insert waits on the unique index until the first
// transaction ends. The first committed: the same event is a no-op, another event under the id is
// refused with event_id_reused (not `added: false`, which would lose it). The first rolled back: the
// second adds its own row. Never a unique violation into the producer's business transaction.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createOutbox, isWebhookError, type Outbox } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const available = await postgresAvailable('outbox add race');

describe.skipIf(!available)('outbox.add of one id by two transactions at once', () => {
  const pool = testPool();
  const table = uniqueTable('outbox_race');
  const outbox: Outbox = createOutbox({ table });
  const url = 'https://receiver.test/hooks';

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

  // Waits until a session is blocked on a lock while inserting into the table: the race is then real.
  async function secondIsWaiting() {
    for (let tries = 0; tries < 500; tries++) {
      const { rows } = await pool.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
        [`%INSERT INTO "${table}"%`],
      );
      if (rows[0].n > 0) return;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    throw new Error('the second add never waited on the first');
  }

  async function race(firstEnds: 'COMMIT' | 'ROLLBACK', secondBody = 'second') {
    const first = await pool.connect();
    const second = await pool.connect();
    try {
      await first.query('BEGIN');
      await second.query('BEGIN');
      expect(await outbox.add(first, { id: 'evt_race', url, body: 'first' })).toEqual({ id: 'evt_race', added: true });
      const late = outbox.add(second, { id: 'evt_race', url, body: secondBody }).catch((error: unknown) => error);
      await secondIsWaiting();
      await first.query(firstEnds);
      const result = await late;
      await second.query('COMMIT');
      return result;
    } finally {
      first.release();
      second.release();
    }
  }

  it('the first commits: the same event again adds nothing, without an error, and its transaction commits', async () => {
    expect(await race('COMMIT', 'first')).toEqual({ id: 'evt_race', added: false });
    const { rows } = await pool.query(`SELECT id, convert_from(body, 'UTF8') AS body FROM "${table}"`);
    expect(rows).toEqual([{ id: 'evt_race', body: 'first' }]);
  });

  it('the first commits: another event under the id is refused with event_id_reused, and its transaction commits', async () => {
    const refused = await race('COMMIT');
    expect(isWebhookError(refused) && refused.code).toBe('event_id_reused');
    const { rows } = await pool.query(`SELECT id, convert_from(body, 'UTF8') AS body FROM "${table}"`);
    expect(rows).toEqual([{ id: 'evt_race', body: 'first' }]);
  });

  it('the first rolls back: the second adds its own event', async () => {
    expect(await race('ROLLBACK')).toEqual({ id: 'evt_race', added: true });
    const { rows } = await pool.query(`SELECT id, convert_from(body, 'UTF8') AS body FROM "${table}"`);
    expect(rows).toEqual([{ id: 'evt_race', body: 'second' }]);
  });
});
