import type { AttemptRecord } from './sender.js';

/**
 * A history entry for a claim whose relay died (or stalled past its lease) before it recorded a
 * result: the attempt it counted in `attempts` was lost, and whether it reached the endpoint is
 * unknown. The claim that takes the row over appends it in the statement that does (so does a 410
 * for another event of the URL that dead-letters the row first), so `history` has one entry per
 * attempt counted, in order (`attempt` is 1, 2, ... since the event was added or last requeued).
 * Told apart from an {@link AttemptRecord} by `result`. Times are epoch ms on the database clock:
 * the row does not keep when the lost claim was made.
 */
export interface LostAttempt {
  /** The number the lost claim counted. */
  attempt: number;
  result: 'lost';
  /** The fencing token (`claims`) the lost claim held. */
  claim: number;
  /** The relay that made the lost claim (`locked_by`). */
  relayId: string;
  /** When the lost claim's lease ran out: the claim was made one lease (of the relay that died) before. */
  leaseEndedAt: number;
  /** When the row was taken over (or dead-lettered by a 410) and the attempt found lost. */
  takenOverAt: number;
}

/** A row of the outbox, as {@link Outbox.deadLetters} lists it. */
export interface OutboxRow {
  id: string;
  url: string;
  status: 'pending' | 'delivered' | 'dead';
  /** Attempts since the event was added, or since its last requeue. */
  attempts: number;
  /** When the event was added. A requeue keeps it. */
  createdAt: Date;
  /** When the event was last requeued (its horizon counts from here), or null. */
  requeuedAt: Date | null;
  deadReason: string | null;
  /**
   * When the row was dead-lettered (PostgreSQL's clock), or null for a row dead-lettered before the
   * outbox kept it (by a version before `dead_at`, or by a relay of one during a rolling upgrade).
   * A requeue clears it.
   */
  deadAt: Date | null;
  /** The last attempt whose result was recorded. A {@link LostAttempt} is never it: nothing came back. */
  lastAttempt: AttemptRecord | null;
  /**
   * Every attempt, in order, the lost ones included, up to 100 entries: past that the first 10 and
   * the latest 90 (each entry's `attempt` says which it was). A requeue keeps it.
   */
  history: (AttemptRecord | LostAttempt)[];
}

/** The {@link OutboxRow} of a row the database returned (its columns, snake_case). */
export function toRow(row: Record<string, any>): OutboxRow {
  return {
    id: row.id,
    url: row.url,
    status: row.status,
    attempts: row.attempts,
    createdAt: row.created_at,
    requeuedAt: row.requeued_at,
    deadReason: row.dead_reason,
    // A dead_at older than the last requeue is stale (see purgeSql): the row's death is not known.
    deadAt: row.dead_at && !(row.requeued_at && row.requeued_at > row.dead_at) ? row.dead_at : null,
    lastAttempt: row.last_attempt,
    history: row.history,
  };
}
