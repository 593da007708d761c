import type { Database } from '../db.js';

/** A note an operator attached to a received webhook event. */
export interface EventNote {
  id: number;
  eventId: string;
  author: string;
  text: string;
  createdAt: string;
}

interface NoteRow {
  id: string | number;
  event_id: string;
  author: string;
  text: string;
  created_at: Date | string;
}

const toNote = (row: NoteRow): EventNote => ({
  id: Number(row.id),
  eventId: row.event_id,
  author: row.author,
  text: row.text,
  createdAt: new Date(row.created_at).toISOString(),
});

/**
 * Adds a note to an event. Each call adds one: it is not idempotent by itself, which is why the admin
 * API puts `@idem/koa`'s `idempotency()` in front of it. That key's record completes after this insert
 * has committed, in another statement: a process killed between the two leaves the note and a key in
 * progress, and the retry runs again once the lease is over. With `requestKey` (the same on every run
 * of one request: `keyFor('note')`), that run finds the note the killed one added and returns it.
 *
 * @example
 * ```ts
 * await addEventNote(db, 'evt_ch_1', 'alice', 'Customer called about this one');
 * await addEventNote(db, 'evt_ch_1', 'alice', 'Refund sent', ctx.state.idempotency.keyFor('note'));
 * ```
 */
export async function addEventNote(
  db: Database,
  eventId: string,
  author: string,
  text: string,
  requestKey?: string,
): Promise<EventNote> {
  const { rows } = await db.query<NoteRow>(
    `insert into receiver_event_notes (event_id, author, text, request_key) values ($1, $2, $3, $4)
     on conflict (request_key) do nothing
     returning id, event_id, author, text, created_at`,
    [eventId, author, text, requestKey ?? null],
  );
  if (rows[0]) return toNote(rows[0]);
  // Only a request key conflicts (NULLs never do): the note of an earlier run of this very request.
  const { rows: added } = await db.query<NoteRow>(
    'select id, event_id, author, text, created_at from receiver_event_notes where request_key = $1',
    [requestKey],
  );
  return toNote(added[0] as NoteRow);
}

/**
 * The notes of one event, oldest first.
 *
 * @example
 * ```ts
 * const notes = await listEventNotes(db, 'evt_ch_1');
 * ```
 */
export async function listEventNotes(db: Database, eventId: string): Promise<EventNote[]> {
  const { rows } = await db.query<NoteRow>(
    'select id, event_id, author, text, created_at from receiver_event_notes where event_id = $1 order by id',
    [eventId],
  );
  return rows.map(toNote);
}
