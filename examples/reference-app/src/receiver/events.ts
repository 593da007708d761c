import type { Database } from '../db.js';

/** What the receiver shows about one event. */
export interface ReceivedEventRow {
  id: string;
  type: string | null;
  chargeId: string | null;
  amount: number | null;
  currency: string | null;
  /** Every verified delivery of this event id, the first and each retry or duplicate. */
  deliveries: number;
  /** How many times its effect was applied: 1 is the whole point, whatever `deliveries` says. */
  applied: number;
  firstDeliveryAt: string;
  lastDeliveryAt: string;
}

/** Anything that runs one parameterised statement: the database, or the inbox's transaction. */
export interface Executor {
  query(text: string, params?: readonly unknown[]): Promise<unknown>;
}

/** The parts of a `payment.succeeded` payload the receiver records. */
export interface PaymentSucceeded {
  type?: unknown;
  data?: { id?: unknown; amount?: unknown; currency?: unknown };
}

/**
 * Records the effect of one event: the "apply" of the inbox. It runs inside the inbox's transaction,
 * so it commits together with the record of the event id; `applied` counts how often that happened,
 * which the inbox keeps at one.
 *
 * @example
 * ```ts
 * await recordApplied(tx, 'evt_ch_1', { type: 'payment.succeeded', data: { id: 'ch_1', amount: 1000, currency: 'EUR' } });
 * ```
 */
export async function recordApplied(tx: Executor, id: string, payload: PaymentSucceeded): Promise<void> {
  const data = payload.data ?? {};
  await tx.query(
    `insert into receiver_events (id, type, charge_id, amount, currency, applied, applied_at)
     values ($1, $2, $3, $4, $5, 1, now())
     on conflict (id) do update set applied = receiver_events.applied + 1, applied_at = now(),
       type = excluded.type, charge_id = excluded.charge_id, amount = excluded.amount, currency = excluded.currency`,
    [
      id,
      typeof payload.type === 'string' ? payload.type : null,
      typeof data.id === 'string' ? data.id : null,
      typeof data.amount === 'number' && Number.isSafeInteger(data.amount) ? data.amount : null,
      typeof data.currency === 'string' ? data.currency : null,
    ],
  );
}

/**
 * Counts one verified delivery of an event id, whatever its outcome (applied, duplicate, busy).
 *
 * @example
 * ```ts
 * await recordDelivery(db, 'evt_ch_1');
 * ```
 */
export async function recordDelivery(db: Executor, id: string): Promise<void> {
  await db.query(
    `insert into receiver_events (id, deliveries) values ($1, 1)
     on conflict (id) do update set deliveries = receiver_events.deliveries + 1, last_delivery_at = now()`,
    [id],
  );
}

/**
 * The received events, newest first.
 *
 * @example
 * ```ts
 * const events = await listReceivedEvents(db);
 * events.every((event) => event.applied === 1); // true
 * ```
 */
export async function listReceivedEvents(db: Database, limit = 100): Promise<ReceivedEventRow[]> {
  const { rows } = await db.query<EventDbRow>(`${selectEvents} order by first_delivery_at desc, id limit $1`, [limit]);
  return rows.map(toEventRow);
}

/**
 * One received event by id, or undefined when the receiver never saw it.
 *
 * @example
 * ```ts
 * const event = await findReceivedEvent(db, 'evt_ch_1');
 * event?.applied; // 1
 * ```
 */
export async function findReceivedEvent(db: Database, id: string): Promise<ReceivedEventRow | undefined> {
  const { rows } = await db.query<EventDbRow>(`${selectEvents} where id = $1`, [id]);
  return rows[0] ? toEventRow(rows[0]) : undefined;
}

interface EventDbRow {
  id: string;
  type: string | null;
  charge_id: string | null;
  amount: number | null;
  currency: string | null;
  deliveries: number;
  applied: number;
  first_delivery_at: Date | string;
  last_delivery_at: Date | string;
}

const selectEvents = `select id, type, charge_id, amount, currency, deliveries, applied, first_delivery_at, last_delivery_at
  from receiver_events`;

function toEventRow(row: EventDbRow): ReceivedEventRow {
  return {
    id: row.id,
    type: row.type,
    chargeId: row.charge_id,
    amount: row.amount,
    currency: row.currency,
    deliveries: row.deliveries,
    applied: row.applied,
    firstDeliveryAt: new Date(row.first_delivery_at).toISOString(),
    lastDeliveryAt: new Date(row.last_delivery_at).toISOString(),
  };
}
