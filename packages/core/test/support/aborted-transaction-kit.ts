// Shared by the three adapters' aborted-transaction tests, on real PostgreSQL: a transactional
// handler that swallows a failed statement ("insert, ignore the unique violation", without a
// SAVEPOINT) leaves its transaction aborted (25P02), so nothing of it can commit. That is the
// handler's failure, not the store's: 500 `transaction_aborted`, the key released, no store-error.
import { randomBytes } from 'node:crypto';
import type { IdempotencyEvent, Store } from '@idem/core';
import { migrate, type PostgresTransaction, postgresStore } from '@idem/postgres';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { post } from './timeouts-kit.js';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

/** What a framework's app needs: the store, the events sink, and the work its handler does before it answers 201. */
export interface AbortedTransactionApp {
  store: Store;
  onEvent: (event: IdempotencyEvent) => void;
  /** Run with the request's transaction and key; the handler then answers 201 `{"ok":true}`. */
  work: (tx: PostgresTransaction, key: string) => Promise<void>;
}

/** Mounts `transactional: true` idempotency and one POST /charges handler, and listens. */
export type MountAbortedTransactionApp = (app: AbortedTransactionApp) => Promise<{
  url: string;
  close: () => Promise<void>;
}>;

export async function describeAbortedTransaction(framework: string, mount: MountAbortedTransactionApp): Promise<void> {
  const withPostgres = serviceAvailable(
    `PostgreSQL at ${databaseUrl}`,
    await postgresAnswers(databaseUrl),
    `the ${framework} aborted-transaction test`,
  );
  describe.runIf(withPostgres)(
    `${framework} transactional on PostgreSQL: a handler that leaves its transaction aborted`,
    () => {
      const run = randomBytes(4).toString('hex');
      const table = `idem_${framework}_aborted_${run}`;
      const payments = `idem_${framework}_aborted_payments_${run}`;
      const effects = `idem_${framework}_aborted_effects_${run}`;
      // Its unique key is checked at COMMIT only.
      const slots = `idem_${framework}_aborted_slots_${run}`;
      let pool: pg.Pool;
      beforeAll(async () => {
        pool = new pg.Pool({ connectionString: databaseUrl, max: 6 });
        pool.on('error', () => undefined);
        await migrate(pool, { table });
        await pool.query(`CREATE TABLE "${payments}" (id text PRIMARY KEY)`);
        await pool.query(`INSERT INTO "${payments}" (id) VALUES ('pay_1')`);
        await pool.query(`CREATE TABLE "${effects}" (key text)`);
        await pool.query(`CREATE TABLE "${slots}" (slot text, UNIQUE (slot) DEFERRABLE INITIALLY DEFERRED)`);
      });
      afterAll(async () => {
        for (const name of [table, payments, effects, slots]) await pool.query(`DROP TABLE IF EXISTS "${name}"`);
        await pool.end();
      });

      it('answers 500 transaction_aborted, commits nothing, releases the key and reports no store-error', async () => {
        const events: IdempotencyEvent[] = [];
        let fixed = false;
        const app = await mount({
          store: postgresStore({ client: pool, table }),
          onEvent: (event) => events.push(event),
          work: async (tx, key) => {
            await tx.query(`INSERT INTO "${effects}" (key) VALUES ($1)`, [key]);
            if (fixed) {
              await tx.query(`INSERT INTO "${payments}" (id) VALUES ('pay_1') ON CONFLICT DO NOTHING`);
              return;
            }
            try {
              await tx.query(`INSERT INTO "${payments}" (id) VALUES ('pay_1')`);
            } catch {
              // "Already there: fine." Without a SAVEPOINT the transaction is now aborted.
            }
          },
        });
        const key = `${framework}-aborted-${run}`;
        try {
          const first = await post(`${app.url}/charges`, key);
          expect(first.status).toBe(500);
          expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
          expect(JSON.parse(first.body)).toMatchObject({
            status: 500,
            code: 'transaction_aborted',
            type: 'https://idem.dev/problems/transaction-aborted',
            retryable: false,
          });
          expect(first.headers['retry-after']).toBeUndefined();
          // The handler's own 201 was not served, and nothing of it committed.
          expect((await pool.query(`SELECT key FROM "${effects}"`)).rows).toEqual([]);
          expect(events.filter((event) => event.type === 'store-error')).toEqual([]);
          expect(events).toContainEqual(
            expect.objectContaining({ type: 'response-not-stored', reason: 'transaction-aborted', status: 201 }),
          );
          expect(events.map((event) => event.type)).toContain('release');

          // The key is free: the retry, with the handler fixed, runs and commits.
          fixed = true;
          const retry = await post(`${app.url}/charges`, key);
          expect(retry.status).toBe(201);
          expect(retry.headers['idempotent-replayed']).toBeUndefined();
          expect((await pool.query(`SELECT key FROM "${effects}"`)).rows).toEqual([{ key }]);
          const replay = await post(`${app.url}/charges`, key);
          expect(replay.status).toBe(201);
          expect(replay.headers['idempotent-replayed']).toBe('true');
        } finally {
          await app.close();
        }
      });

      // Was wrong: a COMMIT refused by a deferred constraint on the handler's own writes was taken
      // for the store's failure: 503 store_unavailable ("retry"), and a store-error event, though the
      // store was fine and the same request would be refused again. It is the handler's failure.
      it('answers 500 transaction_aborted when a deferred constraint refuses the COMMIT, and a corrected retry runs', async () => {
        const events: IdempotencyEvent[] = [];
        let fixed = false;
        const app = await mount({
          store: postgresStore({ client: pool, table }),
          onEvent: (event) => events.push(event),
          work: async (tx, key) => {
            await tx.query(`INSERT INTO "${effects}" (key) VALUES ($1)`, [key]);
            // Twice unless fixed: each statement passes, the COMMIT does not.
            await tx.query(`INSERT INTO "${slots}" (slot) VALUES ($1)${fixed ? '' : ', ($1)'}`, [key]);
          },
        });
        const key = `${framework}-deferred-${run}`;
        try {
          const first = await post(`${app.url}/charges`, key);
          expect(first.status).toBe(500);
          expect(JSON.parse(first.body)).toMatchObject({ status: 500, code: 'transaction_aborted', retryable: false });
          expect(first.headers['retry-after']).toBeUndefined();
          expect((await pool.query(`SELECT key FROM "${effects}" WHERE key = $1`, [key])).rows).toEqual([]);
          expect(events.filter((event) => event.type === 'store-error')).toEqual([]);
          expect(events.map((event) => event.type)).toContain('release');

          fixed = true;
          const retry = await post(`${app.url}/charges`, key);
          expect(retry.status).toBe(201);
          expect(retry.headers['idempotent-replayed']).toBeUndefined();
          expect((await pool.query(`SELECT key FROM "${effects}" WHERE key = $1`, [key])).rows).toEqual([{ key }]);
        } finally {
          await app.close();
        }
      });
    },
  );
}
