import type { Database } from '../db.js';
import type { Executor } from './events.js';

/** The parts of a payment event (`payment.succeeded`, `payment.refunded`) the charge state needs. */
export interface ChargeEvent {
  type?: unknown;
  data?: { id?: unknown; status?: unknown; version?: unknown };
}

/** What the receiver holds as the current state of one charge. */
export interface ChargeState {
  chargeId: string;
  status: string;
  /** The version of the event that set this state. */
  version: number;
  /** The event that set it. */
  eventId: string;
}

/**
 * Applies a payment event to its charge's state, unless the charge already holds a newer one.
 *
 * Senders do not keep events in order: a refund can arrive before the success it follows. Each event
 * carries the charge's version (`data.version`, a positive integer). The upsert writes only when its
 * version is higher than the stored one, so a stale event is recorded as seen by the inbox and
 * acknowledged, but changes nothing. The `where` runs on the row as committed, after the row lock, so
 * two events of one charge applied at the same time still end on the newer one. An event without a
 * charge id or a status has no state to set.
 *
 * Only `payment.succeeded` may leave the version out: the API's has none, and it is a charge's first
 * state, so it counts as version 1. Any other event (a `payment.refunded`, say) without a version, or
 * any event whose version is not a positive integer, throws a `TypeError`: counted as 1 it would lose
 * to the success in silence, and thrown in `apply` it is not recorded, the sender is answered 500 and
 * retries, and the refusal shows in its attempt history until someone fixes the sender.
 *
 * @example
 * ```ts
 * await applyChargeEvent(tx, 'evt_re_1', { type: 'payment.refunded', data: { id: 'ch_1', status: 'refunded', version: 2 } });
 * await applyChargeEvent(tx, 'evt_ch_1', { type: 'payment.succeeded', data: { id: 'ch_1', status: 'succeeded' } }); // v1, older: no change
 * await applyChargeEvent(tx, 'evt_re_2', { type: 'payment.refunded', data: { id: 'ch_2', status: 'refunded' } }); // throws
 * ```
 */
export async function applyChargeEvent(tx: Executor, eventId: string, event: ChargeEvent): Promise<void> {
  const data = event.data ?? {};
  if (typeof data.id !== 'string' || typeof data.status !== 'string') return;
  const version = data.version === undefined && event.type === 'payment.succeeded' ? 1 : data.version;
  if (typeof version !== 'number' || !Number.isSafeInteger(version) || version < 1) {
    const type = typeof event.type === 'string' ? event.type : 'an event without a type';
    throw new TypeError(
      `${type} needs data.version, a positive integer, to be applied: only payment.succeeded may leave it out`,
    );
  }
  await tx.query(
    `insert into receiver_charges (charge_id, status, version, event_id) values ($1, $2, $3, $4)
     on conflict (charge_id) do update
       set status = excluded.status, version = excluded.version, event_id = excluded.event_id, updated_at = now()
       where receiver_charges.version < excluded.version`,
    [data.id, data.status, version, eventId],
  );
}

/**
 * The current state of one charge, or undefined when no event set it.
 *
 * @example
 * ```ts
 * (await findChargeState(db, 'ch_1'))?.status; // 'refunded'
 * ```
 */
export async function findChargeState(db: Database, chargeId: string): Promise<ChargeState | undefined> {
  const { rows } = await db.query<{ charge_id: string; status: string; version: string | number; event_id: string }>(
    'select charge_id, status, version, event_id from receiver_charges where charge_id = $1',
    [chargeId],
  );
  const row = rows[0];
  return row
    ? { chargeId: row.charge_id, status: row.status, version: Number(row.version), eventId: row.event_id }
    : undefined;
}
