import { isStoreUnavailableError, StoreUnavailableError, withoutCommandValues } from '@idem/core';

// SQLSTATE codes (or class prefixes) that say "the database could not do it right now", not "the
// statement is wrong": connection exceptions (08), insufficient resources (53), operator
// intervention such as pg_terminate_backend or a shutdown (57P), statement_timeout (57014),
// lock_timeout (55P03), the transient serialization and deadlock failures (40001, 40P01), a write
// sent to a server that is read-only now (25006: a failover left the pool on the old primary, or on
// a replica), the server's own system and I/O errors (58000, 58030), and a session it ended for
// idling in a transaction or outlasting transaction_timeout (25P03, 25P04: pg reports the code on the
// client's error event, the query after it "not queryable"), timeouts as statement_timeout's is.
const transientStates = [
  '08',
  '53',
  '57P',
  '57014',
  '55P03',
  '40001',
  '40P01',
  '25006',
  '25P03',
  '25P04',
  '58000',
  '58030',
];

// Socket-level failures reported by Node's net and dns modules.
const transientSystemCodes = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ETIMEDOUT',
  'EPIPE',
  'ENOTFOUND',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EAI_AGAIN',
]);

// Failures that pg and PGlite report with a message only, no code.
const transientMessages = [
  /connection terminated/i,
  /timeout exceeded when trying to connect/i,
  /query read timeout/i,
  /not queryable/i,
  /client was closed/i,
  /connection (?:is )?closed/i,
  /cannot use a pool after calling end/i,
  /pglite is closed/i,
];

/**
 * True when `error` is an infrastructure failure (connection refused, reset or terminated, timeouts,
 * a server shutting down, too many connections), as opposed to a mistake in SQL or schema.
 *
 * @example
 * try { await pool.query('SELECT 1'); } catch (error) { if (isTransientDatabaseError(error)) retryLater(); }
 */
export function isTransientDatabaseError(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  if (isStoreUnavailableError(error)) return true;
  const code = (error as { code?: unknown }).code;
  if (typeof code === 'string') {
    // 08P01 (protocol_violation) is both: PgBouncer sends its own passing failures under it
    // (query_wait_timeout, no more connections, cannot connect to the server), and PostgreSQL or
    // PGlite a client's misuse of the protocol, a statement sent with the wrong number of parameters
    // ("bind message supplies 1 parameters, but prepared statement "" requires 2"): a bug that every
    // retry meets again, and no "try later".
    if (code === '08P01' && /^bind message\b/.test(error.message)) return false;
    if (transientSystemCodes.has(code)) return true;
    if (/^[0-9A-Z]{5}$/.test(code) && transientStates.some((state) => code.startsWith(state))) return true;
  }
  // Node reports a refused dual-stack connect ("localhost" tried as ::1 and 127.0.0.1) as an
  // AggregateError whose members carry the codes.
  if (error instanceof AggregateError && error.errors.some((inner) => isTransientDatabaseError(inner))) return true;
  return transientMessages.some((pattern) => pattern.test(error.message));
}

/**
 * Turns an infrastructure failure into a {@link StoreUnavailableError} (the engine answers 503 with
 * `Retry-After`) and leaves every other error as it is. The message names the operation only: it
 * never carries ids, tokens or bodies.
 *
 * @example
 * await pool.query(sql).catch((error) => { throw toStoreError(error, 'claim'); });
 */
export function toStoreError(error: unknown, operation: string): unknown {
  if (isStoreUnavailableError(error)) return error;
  // A non-transient error is passed on as it is, so it is trimmed here too (PGlite's `params`).
  withoutCommandValues(error);
  if (isTransientDatabaseError(error)) {
    return new StoreUnavailableError(`PostgreSQL store unavailable during ${operation}`, { cause: error });
  }
  return error;
}
