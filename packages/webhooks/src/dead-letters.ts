import { assertKnownOptions, type ListsEvery } from '@idem/core';
import { decodeCursor, encodeCursor } from './outbox-cursor.js';
import { type OutboxRow, toRow } from './outbox-row.js';
import type { Queryable } from './queryable.js';

/** One page of {@link Outbox.deadLetters}. */
export interface DeadLetterPage {
  rows: OutboxRow[];
  /** Pass as `after` for the next page; undefined on the last page. */
  next: string | undefined;
}

/** Options of {@link Outbox.deadLetters}. */
export interface DeadLetterOptions {
  /** Rows per page, a positive integer. Default 100. */
  limit?: number | undefined;
  /** The `next` of the previous page: this page starts after it. */
  after?: string | undefined;
}

const deadLetterOptionNames = ['limit', 'after'] as const satisfies readonly (keyof DeadLetterOptions)[];
const deadLetterOptionNamesAll: ListsEvery<DeadLetterOptions, typeof deadLetterOptionNames> = true;
void deadLetterOptionNamesAll;

/** The outbox's `deadLetters` and `requeue`, for the table `table` (quoted). */
export function createDeadLetters(table: string) {
  const deadLetters = async (db: Queryable, listOptions: DeadLetterOptions = {}): Promise<DeadLetterPage> => {
    if (!db || typeof db.query !== 'function') throw new TypeError('deadLetters needs db (a pg Pool or client)');
    if (!listOptions || typeof listOptions !== 'object') throw new TypeError('deadLetters takes an options object');
    // A misspelt `after` would be ignored: every page the first one, and a pager that reads until
    // `next` is undefined would never end.
    assertKnownOptions(listOptions, new Set(deadLetterOptionNames), 'deadLetters');
    const limit = listOptions.limit ?? 100;
    // A safe integer, as the relay's batchSize.
    if (!Number.isSafeInteger(limit) || limit < 1)
      throw new TypeError(`limit must be a positive safe integer (at most ${Number.MAX_SAFE_INTEGER})`);
    const after = listOptions.after === undefined ? undefined : decodeCursor(listOptions.after);
    // Keyset pagination on (created_at, id): a page starts after the last row of the one before, so
    // rows dead-lettered or requeued meanwhile never shift the others to a page already read (as an
    // OFFSET would). A requeue keeps created_at, so a row that dies again keeps its place. One row
    // more than the page says whether there is a next one.
    const { rows } = await db.query(
      `SELECT id, url, status, attempts, created_at, requeued_at, dead_reason, dead_at, last_attempt, history,
              to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') AS position
         FROM ${table}
        WHERE status = 'dead'
          AND ($2::text IS NULL OR (created_at, id) > ($2::timestamp AT TIME ZONE 'UTC', $3::text))
        ORDER BY created_at, id
        LIMIT $1`,
      [limit + 1, after?.createdAt ?? null, after?.id ?? null],
    );
    const page = rows.slice(0, limit);
    const last = page.at(-1);
    return {
      rows: page.map(toRow),
      next: rows.length > limit && last ? encodeCursor({ createdAt: last.position, id: last.id }) : undefined,
    };
  };

  const requeue = async (db: Queryable, id: string) => {
    if (!db || typeof db.query !== 'function') throw new TypeError('requeue needs db (a pg Pool or client)');
    // Anything else matches no row, and `false` would read as "not dead" instead of a caller's bug.
    if (typeof id !== 'string') throw new TypeError('requeue needs the id of a dead event (a string)');
    // created_at stays: it is when the event happened, and the order deadLetters() lists in. The
    // horizon restarts from requeued_at instead. `claims` stays too: it is the fencing token, and
    // resetting it would let a claim from before the requeue match a claim after it.
    const result = await db.query(
      `UPDATE ${table} SET status = 'pending', dead_reason = NULL, dead_at = NULL, next_attempt_at = now(), requeued_at = now(),
              attempts = 0, locked_until = NULL, locked_by = NULL
        WHERE id = $1 AND status = 'dead'`,
      [id],
    );
    return result.rowCount === 1;
  };

  return { deadLetters, requeue };
}
