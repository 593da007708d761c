import type { Database } from '../db.js';

/** Anything that runs one parameterised statement: the database, or the inbox's transaction. */
interface Executor {
  query(text: string, params?: readonly unknown[]): Promise<unknown>;
}

/** The parts of a payment event (`payment.succeeded`, `payment.refunded`) the charge state needs. */
export interface ChargeEvent {
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
 * Creates the receiver's table of charge states. Safe to run on every start.
 *
 * @example
 * ```ts
 * await migrateChargeStates(db);
 * ```
 */
export async function migrateChargeStates(db: Database): Promise<void> {
  await db.exec(`
    create table if not exists receiver_charges (
      charge_id text primary key,
      status text not null,
      version bigint not null,
      event_id text not null,
      updated_at timestamptz not null default now()
    );
  `);
}

/**
 * Applies a payment event to its charge's state, unless the charge already holds a newer one.
 *
 * Senders do not keep events in order: a refund can arrive before the success it follows. Each event
 * carries the charge's version (`data.version`, a positive integer). The API's `payment.succeeded`
 * has none: it is a charge's first state, so it counts as version 1. The upsert writes only when its
 * version is higher than the stored one, so a stale event is recorded as seen by the inbox and
 * acknowledged, but changes nothing. The `where` runs on the row as committed, after the row lock, so
 * two events of one charge applied at the same time still end on the newer one. An event without a
 * charge id or a status, or whose version is not a positive integer, has no state to set.
 *
 * @example
 * ```ts
 * await applyChargeEvent(tx, 'evt_re_1', { data: { id: 'ch_1', status: 'refunded', version: 2 } });
 * await applyChargeEvent(tx, 'evt_ch_1', { data: { id: 'ch_1', status: 'succeeded' } }); // older: no change
 * ```
 */
export async function applyChargeEvent(tx: Executor, eventId: string, event: ChargeEvent): Promise<void> {
  const data = event.data ?? {};
  if (typeof data.id !== 'string' || typeof data.status !== 'string') return;
  const version = data.version === undefined ? 1 : data.version;
  if (typeof version !== 'number' || !Number.isSafeInteger(version) || version < 1) return;
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
