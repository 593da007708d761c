import { isValidWebhookId } from './headers.js';

/** Where a page of dead letters ends: the last row's `created_at` and id. */
export interface OutboxPosition {
  /**
   * `created_at` in UTC as PostgreSQL writes it, to the microsecond (`2026-01-01T00:00:00.123456`).
   * Not a `Date`: a JavaScript date keeps milliseconds, and a cursor rounded to them would skip or
   * repeat rows added in the same millisecond.
   */
  createdAt: string;
  id: string;
}

const CREATED_AT = /^\d{4,}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}$/;

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
    !CREATED_AT.test(parsed[0]) ||
    typeof parsed[1] !== 'string' ||
    !isValidWebhookId(parsed[1])
  ) {
    throw new TypeError('after must be the next cursor of a deadLetters() page');
  }
  return { createdAt: parsed[0], id: parsed[1] };
}
