// Was wrong: a database that failed inside `apply` (its `tx.query` lost the connection in a
// failover, or timed out) was answered 500 `apply_failed`, as a bug is, while the store failing first
// (or at commit) was answered 503 `store_unavailable` with Retry-After. Both are the same outage, and
// the sender should be told the same: retry later. The store's own classification is reused: the
// error `apply` fails with is a `StoreUnavailableError` (the PostgreSQL store's `tx` raises one for a
// connection, timeout or failover failure; a Redis or custom store does the same), as the core's HTTP
// adapters read a handler's failure. A bug (any other error) stays 500.
import { type IdempotencyEvent, memoryStore, StoreUnavailableError } from '@idem/core';
import { migrate, type PostgresTransaction, postgresStore } from '@idem/postgres';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createReceiver, createSigner, type ReceiverEvent } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"id":"pay_1"}}');
const problem = (response: { body: Uint8Array }) => JSON.parse(Buffer.from(response.body).toString());
const available = await postgresAvailable('apply database unavailable');

describe.skipIf(!available)('transactional receiver: the database fails inside apply', () => {
  const pool = testPool();
  const records = uniqueTable('records');
  const effects = uniqueTable('effects');
  beforeAll(async () => {
    await migrate(pool, { table: records });
    await pool.query(`CREATE TABLE "${effects}" (event_id text NOT NULL)`);
  });
  beforeEach(async () => {
    await pool.query(`DELETE FROM "${effects}"`);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${records}"`);
    await pool.query(`DROP TABLE IF EXISTS "${effects}"`);
    await pool.end();
  });

  const outages: [string, string][] = [
    // What a failover or an operator's pg_terminate_backend does to the apply's connection (57P01).
    ['its connection is terminated', 'SELECT pg_terminate_backend(pg_backend_pid())'],
    // A statement the database cannot finish in time (57014).
    ['its statement times out', `SET LOCAL statement_timeout = '1ms'; SELECT pg_sleep(1)`],
  ];
  for (const [what, outage] of outages) {
    it(`answers 503 store_unavailable with Retry-After when ${what}, frees the id, and the retry applies once`, async () => {
      const id = `evt_${what.split(' ').at(-1)}`;
      const events: ReceiverEvent[] = [];
      let down = true;
      const receiver = createReceiver<PostgresTransaction>({
        store: postgresStore({ client: pool, table: records }),
        secret: SECRET,
        onEvent: (event) => events.push(event),
        apply: async (event, tx) => {
          await tx!.query(`INSERT INTO "${effects}" (event_id) VALUES ($1)`, [event.id]);
          if (down) await tx!.query(outage);
        },
      });
      const deliver = () => receiver.handle({ headers: signer.sign({ id, body, timestamp: new Date() }), body });

      const response = await deliver();
      expect(response).toMatchObject({ status: 503, outcome: 'unavailable', id });
      expect(response.headers['retry-after']).toBe('2');
      expect(problem(response)).toMatchObject({ code: 'store_unavailable', retryable: true });
      expect(events).toEqual([
        expect.objectContaining({
          type: 'unavailable',
          code: 'store_unavailable',
          error: expect.objectContaining({ name: 'StoreUnavailableError' }),
        }),
      ]);

      down = false;
      expect(await deliver()).toMatchObject({ status: 200, outcome: 'applied' });
      expect(await deliver()).toMatchObject({ status: 200, outcome: 'duplicate' });
      const { rows } = await pool.query(`SELECT count(*)::int AS n FROM "${effects}" WHERE event_id = $1`, [id]);
      expect(rows).toEqual([{ n: 1 }]);
    });
  }

  it('still answers 500 apply_failed for a bug inside the transaction, whatever its message says', async () => {
    const storeEvents: IdempotencyEvent[] = [];
    const receiver = createReceiver<PostgresTransaction>({
      store: postgresStore({ client: pool, table: records }),
      secret: SECRET,
      onStoreEvent: (event) => storeEvents.push(event),
      apply: async (event, tx) => {
        await tx!.query(`INSERT INTO "${effects}" (event_id) VALUES ($1)`, [event.id]);
        throw new TypeError('connection terminated: data.user is undefined');
      },
    });
    const response = await receiver.handle({
      headers: signer.sign({ id: 'evt_bug', body, timestamp: new Date() }),
      body,
    });
    expect(response).toMatchObject({ status: 500, outcome: 'failed' });
    expect(response.headers['retry-after']).toBeUndefined();
    expect(problem(response)).toMatchObject({ code: 'apply_failed' });
  });
});

describe('receiver without transactions: a store apply uses fails inside apply', () => {
  it('answers 503 store_unavailable with Retry-After and frees the id; a bug stays 500', async () => {
    let failWith: Error | undefined = new StoreUnavailableError('Redis get failed');
    const applied: string[] = [];
    const receiver = createReceiver({
      store: memoryStore(),
      secret: SECRET,
      apply: (event) => {
        if (failWith) throw failWith;
        applied.push(event.id);
      },
    });
    const deliver = () =>
      receiver.handle({ headers: signer.sign({ id: 'evt_memory', body, timestamp: new Date() }), body });
    const response = await deliver();
    expect(response).toMatchObject({ status: 503, outcome: 'unavailable' });
    expect(response.headers['retry-after']).toBe('2');
    expect(problem(response)).toMatchObject({ code: 'store_unavailable' });

    // One raised by a store built against another copy of @idem/core: known by its name.
    failWith = Object.assign(new Error('Redis get failed'), { name: 'StoreUnavailableError' });
    expect(await deliver()).toMatchObject({ status: 503, outcome: 'unavailable' });

    failWith = new RangeError('Invalid time value');
    const bug = await deliver();
    expect(bug).toMatchObject({ status: 500, outcome: 'failed' });
    expect(problem(bug)).toMatchObject({ code: 'apply_failed' });

    failWith = undefined;
    expect(await deliver()).toMatchObject({ status: 200, outcome: 'applied' });
    expect(applied).toEqual(['evt_memory']);
  });
});
