import type { IdempotencyEvent } from '@idem/core';
import { migrate, type PostgresTransaction, postgresStore } from '@idem/postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createReceiver, createSigner, type ReceiverEvent } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"id":"pay_1"}}');
const available = await postgresAvailable('aborted transaction');

describe.skipIf(!available)('transactional receiver: an apply that swallows a failed statement', () => {
  const pool = testPool();
  const records = uniqueTable('records');
  const payments = uniqueTable('payments');
  beforeAll(async () => {
    await migrate(pool, { table: records });
    await pool.query(`CREATE TABLE "${payments}" (id text PRIMARY KEY)`);
    await pool.query(`INSERT INTO "${payments}" (id) VALUES ('pay_1')`);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${records}"`);
    await pool.query(`DROP TABLE IF EXISTS "${payments}"`);
    await pool.end();
  });

  // Was wrong: "insert, and ignore the unique violation" inside `tx` leaves the transaction aborted
  // (25P02), so recording the id failed and the receiver answered 503 `store_unavailable`
  // ("Idempotency store unavailable") with a `record-failed` store-error, on every retry: an operator
  // was sent after a database outage that did not exist, while the cause is the apply's own
  // statement (a SAVEPOINT, or `ON CONFLICT DO NOTHING`, is the fix on the app's side).
  // Decided: a transaction the apply left aborted is the apply's failure: 500 `apply_failed`, the id
  // released (the sender's retry applies it once the apply is fixed), and no store-error.
  it("answers 500 apply_failed, not 503 store_unavailable, reports it as the apply's failure and frees the id", async () => {
    const events: ReceiverEvent[] = [];
    const storeEvents: IdempotencyEvent[] = [];
    let fixed = false;
    const receiver = createReceiver<PostgresTransaction>({
      store: postgresStore({ client: pool, table: records }),
      secret: SECRET,
      onEvent: (event) => events.push(event),
      onStoreEvent: (event) => storeEvents.push(event),
      apply: async (event, tx) => {
        const id = event.json<{ data: { id: string } }>().data.id;
        if (fixed) {
          await tx!.query(`INSERT INTO "${payments}" (id) VALUES ($1) ON CONFLICT DO NOTHING`, [id]);
          return;
        }
        try {
          await tx!.query(`INSERT INTO "${payments}" (id) VALUES ($1)`, [id]);
        } catch {
          // "Already there: fine."
        }
      },
    });
    const deliver = () =>
      receiver.handle({ headers: signer.sign({ id: 'evt_aborted', body, timestamp: new Date() }), body });
    const response = await deliver();
    expect(response).toMatchObject({ status: 500, outcome: 'failed' });
    expect(JSON.parse(Buffer.from(response.body).toString())).toMatchObject({ code: 'apply_failed' });
    expect(events).toEqual([
      expect.objectContaining({
        type: 'failed',
        code: 'apply_failed',
        error: expect.objectContaining({ code: 'transaction_aborted' }),
      }),
    ]);
    expect(storeEvents.filter((event) => event.type === 'store-error')).toEqual([]);

    fixed = true;
    expect(await deliver()).toMatchObject({ status: 200, outcome: 'applied' });
    expect(await deliver()).toMatchObject({ status: 200, outcome: 'duplicate' });
  });
});
