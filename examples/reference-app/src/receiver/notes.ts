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
 * API puts `@idem/koa`'s `idempotency()` in front of it.
 *
 * @example
 * ```ts
 * await addEventNote(db, 'evt_ch_1', 'alice', 'Customer called about this one');
 * ```
 */
export async function addEventNote(db: Database, eventId: string, author: string, text: string): Promise<EventNote> {
  const { rows } = await db.query<NoteRow>(
    'insert into receiver_event_notes (event_id, author, text) values ($1, $2, $3) returning id, event_id, author, text, created_at',
    [eventId, author, text],
  );
  return toNote(rows[0] as NoteRow);
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
