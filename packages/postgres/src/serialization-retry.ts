/*
 * Why a statement of the store may run again.
 *
 * Every statement of the store is one statement in a transaction of its own, written for READ
 * COMMITTED, PostgreSQL's default: an UPDATE or an INSERT ... ON CONFLICT that meets a row changed
 * by a transaction that committed after the statement began waits for it, then works on the newest
 * version. Under REPEATABLE READ or SERIALIZABLE (a `default_transaction_isolation` set on the role,
 * the database, or the pool's `options`) the same statement fails instead, with SQLSTATE 40001:
 * - the losers of a claim race meet the winner's new row;
 * - a completion meets the renewal of the heartbeat that landed just before it;
 * - SERIALIZABLE may also cancel a statement for a conflict it only suspects.
 * The failed statement's transaction is rolled back, so the statement had no effect, and run again it
 * takes a fresh snapshot, which holds what the other transaction committed: exactly what READ
 * COMMITTED would have done. So a serialization failure of one of the store's own statements is run
 * again, a few times, instead of being reported as an outage (503).
 *
 * Never inside a transaction of the handler's (transactional mode): there 40001 aborts the whole
 * transaction, the handler's writes with it, and only the caller may decide to run the handler again.
 */

/** How often one statement is tried in all when it keeps failing with 40001. */
export const serializationAttempts = 8;

/** The longest pause between two tries, in milliseconds. */
export const maxSerializationPauseMs = 8;

/**
 * The pause before try `attempt + 1`: random, up to 1, 2, 4, then 8 ms. Writers that collide on one
 * row (a completion and the heartbeat's renewals; SERIALIZABLE's suspected conflicts too) ran again
 * at once would meet again; spread apart, each finds the others committed. At most about 40 ms in all.
 */
function serializationPause(attempt: number): Promise<void> {
  const ms = serializationPauseMs(attempt, Math.random());
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * The length of {@link serializationPause} for `attempt` and a draw of `random` in [0, 1).
 *
 * @example
 * serializationPauseMs(3, 0.5); // 2
 */
export function serializationPauseMs(attempt: number, random: number): number {
  return random * Math.min(2 ** (attempt - 1), maxSerializationPauseMs);
}

const SERIALIZATION_FAILURE = '40001';

/**
 * True when `error`, or the error it wraps as `cause` (a `StoreUnavailableError`), is a PostgreSQL
 * serialization failure (SQLSTATE 40001).
 *
 * @example
 * isSerializationFailure(Object.assign(new Error('could not serialize access'), { code: '40001' })); // true
 */
export function isSerializationFailure(error: unknown): boolean {
  for (let current = error, depth = 0; current instanceof Error && depth < 3; depth++) {
    if ((current as { code?: unknown }).code === SERIALIZATION_FAILURE) return true;
    current = current.cause;
  }
  return false;
}

/**
 * Runs `statement` (one statement in its own transaction) and, while it fails with a serialization
 * failure, runs it again after a short random pause ({@link serializationPause}), up to
 * {@link serializationAttempts} times in all. Any other failure, and the last serialization failure,
 * is rethrown unchanged.
 *
 * @example
 * async function expire(sql: SqlExecutor, key: string) {
 *   const { rowCount } = await retrySerializationFailures(() => sql.query('DELETE FROM idem WHERE key = $1', [key]));
 *   return rowCount;
 * }
 */
export async function retrySerializationFailures<T>(
  statement: () => Promise<T>,
  pause: (attempt: number) => Promise<void> = serializationPause,
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await statement();
    } catch (error) {
      if (attempt >= serializationAttempts || !isSerializationFailure(error)) throw error;
    }
    await pause(attempt);
  }
}
