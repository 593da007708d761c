import { assertKnownOptions } from '@idem/core';
import { createDeadLetters, type DeadLetterOptions, type DeadLetterPage } from './dead-letters.js';
import type { WebhookError } from './errors.js';
import { createAdd, type OutboxEvent } from './outbox-add.js';
import { createMigrate, type OutboxMigrateOptions, quoteTable } from './outbox-schema.js';
import { createPurge, type PurgeOptions } from './purge.js';
import type { Queryable } from './queryable.js';
import { createRelay, type Relay } from './relay.js';
import type { RelayOptions } from './relay-options.js';
import type { Sender } from './sender.js';

/** Options of {@link createOutbox}. */
export interface OutboxOptions {
  /** Table name, optionally schema-qualified. Default `idem_webhook_outbox`. */
  table?: string | undefined;
}

/** A PostgreSQL transactional outbox for webhooks. */
export interface Outbox {
  readonly table: string;
  /**
   * Creates the table and its indexes if missing (and an index that does the same work under another
   * name counts). Safe to run from several processes at once; once all is there, it takes no lock
   * that would hold up a relay or an `add()`.
   */
  migrate(db: Queryable, options?: OutboxMigrateOptions): Promise<void>;
  /**
   * Records an event inside the caller's transaction: pass the client that ran `BEGIN`. It is sent only
   * if that transaction commits. Adding the same event (url, body bytes, content type and headers, as
   * the relay sends them: header names in any case, values trimmed, no `content-length`, `content-type`
   * or signer's `webhook-*` header, the media type and parameter names in any case, the charset's
   * value too, a parameter's value quoted or not) under an id the outbox holds is a no-op
   * (`added: false`); another event under it is refused with a
   * {@link WebhookError} `event_id_reused`, and the transaction is left as it was. An id that others
   * keep adding and deleting while add() looks at it (three times over) is `event_id_contended`:
   * nothing added, the transaction left as it was, and add() may be tried again. An event that
   * could never be sent (a URL that is not http: or https:, a header fetch refuses or the sender sets or counts
   * itself, no body) throws a
   * `TypeError` here instead of failing every attempt until the horizon.
   */
  add(tx: Queryable, event: OutboxEvent): Promise<{ id: string; added: boolean }>;
  /** Creates a relay that delivers the committed events. */
  relay(options: RelayOptions): Relay;
  /**
   * Lists dead-lettered events, oldest first (by `created_at`, then id), one page at a time: pass a
   * page's `next` as `after` to get the following one. A malformed `after` or `limit`, or an option
   * it does not know, rejects with a `TypeError`.
   *
   * @example
   * let page = await outbox.deadLetters(pool, { limit: 100 });
   * for (;;) {
   *   for (const row of page.rows) console.log(row.id, row.deadReason);
   *   if (!page.next) break;
   *   page = await outbox.deadLetters(pool, { limit: 100, after: page.next });
   * }
   */
  deadLetters(db: Queryable, options?: DeadLetterOptions): Promise<DeadLetterPage>;
  /**
   * Moves a dead-lettered event back to pending, due now, with a fresh horizon (counted from
   * `requeued_at`) and a fresh count of attempts, and clears its `dead_at`. Its `created_at` and
   * history keep the old ones.
   * True if it was dead.
   */
  requeue(db: Queryable, id: string): Promise<boolean>;
  /**
   * Deletes delivered rows whose `delivered_at` is older than `olderThan` (and, with `dead: true`,
   * dead-lettered rows whose `dead_at` is older than that), `batchSize` rows per DELETE,
   * until a batch deletes fewer, and resolves to how many it deleted. The age is measured by
   * PostgreSQL's clock (`now()`), as the relay's schedule is. A pending row, or one a relay holds, is
   * never deleted, even one that a requeue turns pending while the batch runs. Pass a pool: each
   * batch is then its own short transaction (on a client inside a transaction, they all commit with
   * it). Safe to run from several processes at once. A bad option rejects with a `TypeError`.
   *
   * Once a row is gone, `add()` with its id adds the event again (and it is sent again): keep rows
   * longer than a producer may add the same id.
   *
   * @example
   * const outbox = createOutbox({ table: 'webhook_outbox' });
   * // Every hour: delivered rows go after 30 days, dead letters 90 days after they died.
   * await outbox.purge(pool, { olderThan: '30d' });
   * const { deleted } = await outbox.purge(pool, { olderThan: '90d', dead: true, batchSize: 500 });
   */
  purge(db: Queryable, options: PurgeOptions): Promise<{ deleted: number }>;
}

/**
 * Creates a transactional outbox: `add(tx, event)` writes the event in the business transaction, and
 * relays deliver committed events with a {@link Sender}, at least once.
 *
 * Why it is safe:
 * - An event exists only if the business change committed, and it stays until a 2xx was recorded.
 * - Relays claim rows with `FOR UPDATE SKIP LOCKED` and a lease (`locked_until`), so several relays
 *   share the work without waiting on each other or taking the same row.
 * - A relay that crashes mid-delivery leaves its rows leased; when the lease ends another relay
 *   takes them over, records the lost attempt in their history and, after a backoff wait, delivers
 *   them again. The receiver absorbs that duplicate by `webhook-id`.
 * - Results are written only under the claim that made the attempt (`locked_by` and `claims`, which
 *   every claim raises and nothing lowers): a relay whose lease ran out cannot overwrite the outcome
 *   recorded by the claim that took over, even one made under the same `relayId`, even after a
 *   requeue reset the attempt count.
 * - Retries follow the sender's schedule, timed by PostgreSQL's clock (`now()`). A row taken over
 *   from a dead relay counts as a failed attempt: it waits out the backoff before the next one, so a
 *   row that kills every relay that sends it is not sent again after every lease. It is never
 *   attempted past `maxAttempts` or the horizon: it is dead-lettered. A takeover that dies too
 *   counts as well. A row found past either limit is dead-lettered by the claim itself.
 * - A 410 Gone dead-letters every waiting event for that URL (the endpoint asked to be disabled).
 *
 * @example
 * const outbox = createOutbox({ table: 'webhook_outbox' });
 * await outbox.migrate(pool);
 * const client = await pool.connect();
 * await client.query('BEGIN');
 * await client.query('UPDATE orders SET paid = true WHERE id = $1', [orderId]);
 * await outbox.add(client, { url: endpoint, body: { type: 'order.paid', orderId } });
 * await client.query('COMMIT');
 * client.release();
 * outbox.relay({ db: pool, sender }).start();
 */
export function createOutbox(options: OutboxOptions = {}): Outbox {
  if (options === null || typeof options !== 'object') throw new TypeError('createOutbox takes an options object');
  assertKnownOptions(options, new Set(['table']), 'createOutbox');
  const { sql: table, base } = quoteTable(options.table ?? 'idem_webhook_outbox');
  const name = options.table ?? 'idem_webhook_outbox';
  const migrate = createMigrate(table, base);
  const add = createAdd(table);
  const relay = (relayOptions: RelayOptions): Relay => createRelay(table, relayOptions);
  const { deadLetters, requeue } = createDeadLetters(table);
  const purge = createPurge(table);

  return { table: name, migrate, add, relay, deadLetters, requeue, purge };
}
