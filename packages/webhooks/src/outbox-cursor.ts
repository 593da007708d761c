import { isValidWebhookId } from './headers.js';

/** Where a page of dead letters ends: the last row's `created_at` and id. */
export interface OutboxPosition {
  /**
   * `created_at` in UTC as PostgreSQL writes it, to the microsecond (`2026-01-01T00:00:00.123456`),
   * years 0001 to 9999.
   * Not a `Date`: a JavaScript date keeps milliseconds, and a cursor rounded to them would skip or
   * repeat rows added in the same millisecond.
   */
  createdAt: string;
  id: string;
}

const CREATED_AT = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\.\d{6}$/;

/**
 * Whether `value` is a `created_at` as {@link encodeCursor} writes it: a date and time that exists,
 * year 0001 to 9999, and six digits of microseconds. The shape alone is not enough: PostgreSQL
 * refuses `2026-02-30` or `0000-01-01` with a DatabaseError (22008), where a tampered cursor owes
 * the caller a TypeError. The seconds part must read back unchanged through a `Date` (which would
 * roll 30 February over to 2 March, or 24:00 to the next day).
 */
function isCreatedAt(value: string): boolean {
  const seconds = CREATED_AT.exec(value)?.[1];
  if (seconds === undefined || seconds.startsWith('0000')) return false;
  const date = new Date(`${seconds}Z`);
  return !Number.isNaN(date.getTime()) && date.toISOString().slice(0, 19) === seconds;
}

/**
 * Encodes a position as an opaque cursor (base64url of JSON), so callers pass it back unchanged
 * instead of building one, and the encoding can change without breaking them.
 *
 * @example
 * encodeCursor({ createdAt: '2026-01-01T00:00:00.123456', id: 'evt_1' }); // 'WyIyMDI2LTAx...'
 */
export function encodeCursor(position: OutboxPosition): string {
  return Buffer.from(JSON.stringify([position.createdAt, position.id]), 'utf8').toString('base64url');
}

/**
 * Reads a cursor made by {@link encodeCursor}. Anything else throws a `TypeError`: a cursor is not
 * user input to guess at, and a wrong page would look like a right one.
 *
 * @example
 * decodeCursor(page.next); // { createdAt: '2026-01-01T00:00:00.123456', id: 'evt_1' }
 */
export function decodeCursor(cursor: string): OutboxPosition {
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    parsed = undefined;
  }
  if (
    !Array.isArray(parsed) ||
    parsed.length !== 2 ||
    typeof parsed[0] !== 'string' ||
    !isCreatedAt(parsed[0]) ||
    typeof parsed[1] !== 'string' ||
    !isValidWebhookId(parsed[1])
  ) {
    throw new TypeError('after must be the next cursor of a deadLetters() page');
  }
  return { createdAt: parsed[0], id: parsed[1] };
}
