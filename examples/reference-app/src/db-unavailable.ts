import { isTransientDatabaseError } from '@idem/postgres';

/**
 * The `Retry-After` (seconds) of an answer a service gives because its database failed: as long as
 * the idempotency core's own for a store that is unavailable (a blip, a failover).
 */
export const storeRetryAfterSeconds = 2;

// The errors of a bug in the app itself: whatever their message says, they stay a 500.
const bugClasses = [TypeError, RangeError, ReferenceError, SyntaxError];

/**
 * True when `error` says the database could not answer now (DESIGN.md's HTTP table: a 503 with
 * `Retry-After`, never a 500): a connection refused, reset or ended by the server (SQLSTATE class 08,
 * 57P01/57P02/57P03), the pool's "timeout exceeded when trying to connect", a PGlite that is closed,
 * and the other transient failures `@idem/postgres` retries its own stores on (a deadlock, a
 * statement timeout); or a `StoreUnavailableError` of a store. Only the error itself is looked at, not
 * its `cause`: a `fetch` to the provider that failed carries ECONNREFUSED in its cause, and is no
 * database's. A bug (a TypeError and its kind) never counts, whatever its message says.
 *
 * @example
 * ```ts
 * dbUnavailable(Object.assign(new Error('terminating connection'), { code: '57P01' })); // true
 * dbUnavailable(new TypeError('data.user is undefined')); // false
 * ```
 */
export function dbUnavailable(error: unknown): boolean {
  if (bugClasses.some((kind) => error instanceof kind)) return false;
  return isTransientDatabaseError(error);
}
