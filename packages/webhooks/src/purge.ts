import { assertKnownOptions, type Duration, type ListsEvery, toMilliseconds } from '@idem/core';
import type { Queryable } from './queryable.js';

/** Options of {@link Outbox.purge}. */
export interface PurgeOptions {
  /**
   * Delivered rows whose `delivered_at` is older than this go (`'30d'`, or milliseconds). Required:
   * how long a producer may add the same id again is yours to say (see {@link Outbox.purge}).
   */
  olderThan: Duration;
  /**
   * Dead-lettered rows go too, once dead-lettered longer than `olderThan` ago (`dead_at`). A row
   * dead-lettered before the outbox kept `dead_at` (by an earlier version) is aged by the later of
   * `created_at`, `requeued_at` and `next_attempt_at` instead: its last write set that one to when
   * it died, or later. Default false.
   */
  dead?: boolean | undefined;
  /** Rows per DELETE statement, each its own short transaction on a pool. Default 1000. */
  batchSize?: number | undefined;
  /** Stops before the next batch once aborted; the rows deleted so far are counted. */
  signal?: AbortSignal | undefined;
}

const purgeOptionNames = [
  'olderThan',
  'dead',
  'batchSize',
  'signal',
] as const satisfies readonly (keyof PurgeOptions)[];
const purgeOptionNamesAll: ListsEvery<PurgeOptions, typeof purgeOptionNames> = true;
void purgeOptionNamesAll;

// The longest olderThan the cutoff takes, in ms (about 3,170 years): now() less a longer one falls
// before the earliest timestamp PostgreSQL holds, and the DELETE would fail. No row is that old.
const maxOlderThanMs = 1e14;

/** The outbox's `purge`, for the table `table` (quoted). */
export function createPurge(table: string) {
  // One batch of purge(), for delivered rows or dead ones: $1 rows at most, older than $2 ms. The
  // inner SELECT walks the kind's partial index in order and stops after $1 rows, locking each one
  // (SKIP LOCKED: a row a requeue, a relay or another purge holds is left for the next call). The
  // outer DELETE finds them by primary key: `id IN (SELECT ...)` let the planner hash-join the batch
  // against a scan of the whole table (or of the whole partial index), every batch; and the age is
  // not said again there, or the planner may walk the kind's index for it instead of the key. The
  // status is: the row deleted is the row that was selected, and a row a requeue turned pending after
  // the statement's snapshot is re-read under its lock and no longer matches. (A requeue is the one
  // write that moves the age of a delivered or dead row, and it makes the row pending.) A delivered
  // or dead row holds no lease (every statement that ends a claim clears it); the lease is checked
  // all the same, so that no row a relay holds could ever go. now() is the statement's own
  // transaction's start on a pool, and a stable value: the index can use it. A requeue clears
  // dead_at, and every statement that dead-letters a row sets it, so no other write moves a dead
  // row's age either.
  const cutoff = `now() - ($2::double precision * interval '1 millisecond')`;
  const purgeBatch = (status: 'delivered' | 'dead', old: string, order: string) =>
    `DELETE FROM ${table}
      WHERE id = ANY(ARRAY(
              SELECT id FROM ${table}
               WHERE status = '${status}' AND ${old}
               ORDER BY ${order}
               LIMIT $1
                 FOR UPDATE SKIP LOCKED))
        AND status = '${status}' AND (locked_until IS NULL OR locked_until <= now())`;
  const purgeSql = {
    delivered: purgeBatch('delivered', `delivered_at < ${cutoff}`, 'delivered_at'),
    // From when the row died: a row that retried for a year and died yesterday is a day old here.
    // Ordered as `_dead_at` is, so the scan reads that index in order and stops after $1 rows.
    // A dead_at older than requeued_at is stale: a relay of an earlier version requeued the row
    // (keeping the first death's dead_at) and dead-lettered it again without one. Such a row is aged
    // as one without dead_at is; its dead_at is still older than the cutoff, so the index bound holds.
    dead: purgeBatch(
      'dead',
      `dead_at < ${cutoff}
                 AND (requeued_at IS NULL OR requeued_at <= dead_at
                      OR (requeued_at < ${cutoff} AND next_attempt_at < ${cutoff}))`,
      'dead_at, next_attempt_at',
    ),
    // A row dead-lettered before dead_at existed (by an earlier version, or by a relay of one during
    // a rolling upgrade) has none. Its age is the later of created_at, requeued_at and
    // next_attempt_at: every version's last write to a row it dead-lettered set next_attempt_at to
    // then (a failed last attempt, a 410), to a wait that would have passed the horizon (later), or
    // left the time the row fell due (a claim past its limits, a 410 of another event: earlier, by
    // as long as the relays were behind). Never younger than created_at and requeued_at alone, the
    // age those versions purged by: the upgrade deletes no such row sooner than they would have.
    // The IS NULL keeps the scan to the NULLs at the end of `_dead_at`, in next_attempt_at order,
    // and the ORDER BY is the index's own, so no sort reads them all first.
    deadBefore: purgeBatch(
      'dead',
      `dead_at IS NULL AND next_attempt_at < ${cutoff} AND created_at < ${cutoff}
                 AND (requeued_at IS NULL OR requeued_at < ${cutoff})`,
      'dead_at, next_attempt_at',
    ),
  };

  const purge = async (db: Queryable, purgeOptions: PurgeOptions): Promise<{ deleted: number }> => {
    if (!db || typeof db.query !== 'function') throw new TypeError('purge needs db (a pg Pool or client)');
    if (!purgeOptions || typeof purgeOptions !== 'object')
      throw new TypeError("purge needs options with olderThan (such as { olderThan: '30d' })");
    assertKnownOptions(purgeOptions, new Set(purgeOptionNames), 'purge');
    const { olderThan, dead = false, batchSize = 1000, signal } = purgeOptions;
    // No default: a wrong guess deletes what a producer may still add again (see the TSDoc).
    if (olderThan === undefined) throw new TypeError("purge needs olderThan (such as '30d')");
    const olderThanMs = Math.min(toMilliseconds(olderThan, 'olderThan'), maxOlderThanMs);
    if (typeof dead !== 'boolean') throw new TypeError('dead must be true or false');
    // A safe integer: pg would send 1e21 as "1e+21", which LIMIT refuses on every batch.
    if (!Number.isSafeInteger(batchSize) || batchSize < 1)
      throw new TypeError(`batchSize must be a positive safe integer (at most ${Number.MAX_SAFE_INTEGER})`);
    if (signal !== undefined && !(signal instanceof AbortSignal)) throw new TypeError('signal must be an AbortSignal');
    let deleted = 0;
    for (const sql of dead ? [purgeSql.delivered, purgeSql.dead, purgeSql.deadBefore] : [purgeSql.delivered]) {
      for (;;) {
        if (signal?.aborted) return { deleted };
        const { rowCount } = await db.query(sql, [batchSize, olderThanMs]);
        deleted += rowCount ?? 0;
        // Fewer than a batch: nothing more is old enough, or the rest is locked (left for next time).
        if ((rowCount ?? 0) < batchSize) break;
      }
    }
    return { deleted };
  };

  return purge;
}
