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
  // (25P02), so recording the id fails at commit and the receiver answers 503 `store_unavailable`
  // ("Idempotency store unavailable") with a `record-failed` store-error, on every retry: an operator
  // is sent after a database outage that does not exist, while the cause is the apply's own
  // statement (a SAVEPOINT, or `ON CONFLICT DO NOTHING`, is the fix on the app's side).
  // Needs a decision: (a) postgresStore reports a completion refused because the caller's statements
  // already aborted the transaction as the handler's failure, so the engine rethrows it and the
  // receiver answers 500 `apply_failed` (the HTTP adapters' transactional mode would change the same
  // way); (b) keep 503 and document the pattern in the receiver's transactional-mode section;
  // (c) a distinct code for "the handler's transaction was aborted".
  it.fails("answers 500 apply_failed, not 503 store_unavailable, and reports it as the apply's failure", async () => {
    const events: ReceiverEvent[] = [];
    const receiver = createReceiver<PostgresTransaction>({
      store: postgresStore({ client: pool, table: records }),
      secret: SECRET,
      onEvent: (event) => events.push(event),
      apply: async (event, tx) => {
        try {
          await tx!.query(`INSERT INTO "${payments}" (id) VALUES ($1)`, [
            event.json<{ data: { id: string } }>().data.id,
          ]);
        } catch {
          // "Already there: fine."
        }
      },
    });
    const response = await receiver.handle({
      headers: signer.sign({ id: 'evt_aborted', body, timestamp: new Date() }),
      body,
    });
    expect(response).toMatchObject({ status: 500, outcome: 'failed' });
    expect(events.map((event) => event.type)).toEqual(['failed']);
  });
});
