import { createHash } from 'node:crypto';
import type { TableName } from './table-name.js';

/** One SQL statement, the name it is prepared under on each pg connection, and what it does. */
export interface Statement {
  readonly name: string;
  readonly text: string;
  /** The store operation it serves (`claim`, `complete`, ...): what an error message names. */
  readonly operation: string;
}

/** Every statement the store runs, for one table. */
export interface Statements {
  claim: Statement;
  renew: Statement;
  complete: Statement;
  release: Statement;
  forget: Statement;
  get: Statement;
  completeInTransaction: Statement;
  releaseInTransaction: Statement;
  purge: Statement;
}

const legacyColumns = 'state, token, fingerprint, status, headers, body';
// A record in progress whose lease ran out with nobody renewing it: abandoned until `expires_at`.
// `lease_until` is NULL for a claim kept no longer than its lease (and for a row of an older version).
const abandoned = `(state = 'in_progress' AND lease_until IS NOT NULL AND lease_until <= clock_timestamp())`;
// The claim's `replaces` ($6, NULL when it names none) is the token of the abandoned record it takes over.
const replaced = `(${abandoned} AND token IS NOT DISTINCT FROM $6::text)`;

// The database's clock, never the application's. clock_timestamp() rather than now(): inside a long
// transaction now() is the time the transaction began, not the time of the statement.
const clock = 'clock_timestamp()';
// A duration arrives as milliseconds in parameter $n and becomes an interval in SQL.
const after = (n: number) => `(clock_timestamp() + $${n}::float8 * interval '1 millisecond')`;
// What purge may delete (see `purge` below), with `now` the clock as written where it is used.
const purgeable = (now: string) =>
  `expires_at <= ${now} AND (state = 'completed' OR expires_at <= ${now} - $2::float8 * interval '1 millisecond')`;
// clock_timestamp() is volatile: written bare, PostgreSQL evaluates it row by row and it cannot bound
// an index scan, so the batch's scan walked the whole expires_at index (in order, filtering) whenever
// fewer than a batch had expired: every steady-state call, and the last call of every drain. Read
// through a sub-select, it is evaluated once per statement (an InitPlan) and becomes the index
// condition, so the scan stops at the first record still live.
const purgeClock = '(SELECT clock_timestamp())';

/**
 * One of the store's statements under its prepared name: `idem_<op>_` and a hash of the store's `tag`
 * (its table's) and of the text, so a name stands for one text of one table (see {@link buildStatements}).
 *
 * @example
 * const get = namedStatement('get', tag, 'SELECT 1');
 * get.name; // 'idem_get_' and 12 hex digits
 */
export function namedStatement(op: string, tag: string, text: string): Statement {
  return {
    name: `idem_${op}_${createHash('sha256').update(`${tag}\0${text}`).digest('hex').slice(0, 12)}`,
    text,
    operation: op,
  };
}

/**
 * Builds the store's SQL for `table`. A statement's name is a hash of `tag` (the table's) and of
 * its text: two stores on different tables never reuse each other's prepared statements on a
 * shared connection, and neither do two versions of this package whose SQL differs. Behind a pooler
 * in transaction mode server sessions are shared by every instance of a rolling deploy, and pg Binds
 * a statement it prepared on one session by name on the next: under a name that stood for the table
 * alone, an older version's claim ran in place of this one's.
 *
 * `statusMessage` says whether the table has the `status_message` column (added by a later
 * migrate()): without it the statements are those of the versions before it, which neither write
 * nor read a reason phrase, so a store deployed before its table was migrated keeps working. With
 * it, `complete` and `completeInTransaction` take the phrase as $7 (NULL for none), the claim that
 * takes a record over clears it with the rest of the last answer, and the reads return it.
 *
 * @example
 * const sql = buildStatements(parseTableName('idem_records'), 'a1b2c3d4', { statusMessage: true });
 * await pool.query({ ...sql.get, values: [id, 0] });
 */
export function buildStatements(table: TableName, tag: string, options: { statusMessage: boolean }): Statements {
  const t = table.sql;
  const phrase = options.statusMessage;
  const columns = phrase ? `${legacyColumns}, status_message` : legacyColumns;
  // Each text below is the earlier versions' exactly when `phrase` is false: same SQL, same name.
  const clearPhrase = phrase ? ', status_message = NULL' : '';
  const noPhrase = phrase ? ', NULL::text AS status_message' : '';
  const setPhrase = phrase ? ', status_message = $7::text' : '';
  const named = (op: string, text: string): Statement => namedStatement(op, tag, text);
  return {
    // One statement, three outcomes (a fourth with `replaces`, see below):
    // - `live` reads the record with the statement's snapshot. If it is live, the INSERT inserts
    //   nothing, so a replay or a 409 is a plain read: no row lock, no WAL, no commit to flush.
    // - Otherwise INSERT ... ON CONFLICT DO UPDATE inserts, or takes over a record whose lease or
    //   retention has run out. ON CONFLICT locks the conflicting row and evaluates its WHERE against
    //   the newest committed version, so of N concurrent claims exactly one sees `claimed`.
    // - A row committed after the snapshot is invisible to `live` yet blocks the INSERT: then the
    //   statement returns no row at all, and the caller runs it again with a fresh snapshot. (Under
    //   REPEATABLE READ or SERIALIZABLE it fails with 40001 instead, and is run again all the same.)
    // - A claim that names the token of an abandoned record (`replaces`, $6) goes past `live` and
    //   takes the row over through the same ON CONFLICT, whose WHERE checks on the newest version
    //   that it is still that abandoned record. Of N such claims one wins; the others return no row
    //   (their `live` row is filtered out as the one they meant to replace) and run again, to read
    //   the winner's claim.
    // The lease ends at `lease_until` ($4 ms from now) and the record goes $5 ms after that (the
    // keep; 0 leaves `lease_until` NULL, a record that goes with its lease).
    claim: named(
      'claim',
      `WITH live AS (
  SELECT ${columns}, ${abandoned} AS abandoned, ${replaced} AS replaced FROM ${t} WHERE id = $1 AND expires_at > ${clock}
), claimed AS (
  INSERT INTO ${t} AS r (id, state, token, fingerprint, lease_until, expires_at)
  SELECT $1, 'in_progress', $2::text, $3::text, CASE WHEN $5::float8 > 0 THEN ${after(4)} END,
         ${after(4)} + $5::float8 * interval '1 millisecond'
  WHERE NOT EXISTS (SELECT 1 FROM live WHERE NOT replaced)
  ON CONFLICT (id) DO UPDATE
    SET state = 'in_progress', token = excluded.token, fingerprint = excluded.fingerprint,
        status = NULL, headers = NULL, body = NULL${clearPhrase}, lease_until = excluded.lease_until, expires_at = excluded.expires_at
    WHERE r.expires_at <= ${clock}
       OR (r.state = 'in_progress' AND r.lease_until <= ${clock} AND r.token = $6::text)
  RETURNING r.id
)
SELECT true AS claimed, NULL::text AS state, NULL::text AS token, NULL::text AS fingerprint,
       NULL::integer AS status, NULL::jsonb AS headers, NULL::bytea AS body${noPhrase}, NULL::boolean AS abandoned
FROM claimed
UNION ALL
SELECT false, ${columns}, abandoned FROM live WHERE NOT replaced`,
    ),
    // The keep after the lease carries over: the record goes as long after its new lease as after
    // its old one.
    renew: named(
      'renew',
      `UPDATE ${t} SET lease_until = CASE WHEN lease_until IS NOT NULL THEN ${after(3)} END,
  expires_at = ${after(3)} + (expires_at - COALESCE(lease_until, expires_at))
WHERE id = $1 AND token = $2 AND state = 'in_progress' AND expires_at > ${clock}`,
    ),
    // An abandoned record completes too (nobody took it over): its holder did the work.
    complete: named(
      'complete',
      `UPDATE ${t} SET state = 'completed', status = $3, headers = $4::jsonb, body = $5${setPhrase}, lease_until = NULL,
  expires_at = ${after(6)}
WHERE id = $1 AND token = $2 AND state = 'in_progress' AND expires_at > ${clock}`,
    ),
    release: named(
      'release',
      `DELETE FROM ${t} WHERE id = $1 AND token = $2 AND state = 'in_progress' AND expires_at > ${clock}`,
    ),
    // Any state: the token is the only fence (see Store.forget). An expired row is gone to every
    // other statement, so it is gone here too: false, and purge reclaims it.
    forget: named('forget', `DELETE FROM ${t} WHERE id = $1 AND token = $2 AND expires_at > ${clock}`),
    // The phrase read as text whatever the column's type now: a pg statement prepared while it was
    // text would otherwise refuse to run on that connection once it had another type (0A000, "cached
    // plan must not change result type"), varchar included, which the store accepts.
    get: named(
      'get',
      `SELECT ${phrase ? `${legacyColumns}, status_message::text AS status_message` : legacyColumns}, ${abandoned} AS abandoned FROM ${t} WHERE id = $1 AND expires_at > ${clock}`,
    ),
    // Inside a transaction the compare-and-set is on the token alone. A lease that ran out while the
    // handler worked is still safe to complete if nobody took it over: a takeover replaces the token
    // (so this matches nothing), and a takeover attempted after this UPDATE waits for the row lock
    // and then finds the record completed.
    completeInTransaction: named(
      'complete_tx',
      `UPDATE ${t} SET state = 'completed', status = $3, headers = $4::jsonb, body = $5${setPhrase}, lease_until = NULL,
  expires_at = ${after(6)}
WHERE id = $1 AND token = $2 AND state = 'in_progress'`,
    ),
    releaseInTransaction: named(
      'release_tx',
      `DELETE FROM ${t} WHERE id = $1 AND token = $2 AND state = 'in_progress'`,
    ),
    // Bounded: at most $1 rows per call, oldest first, skipping rows another session holds (a claim
    // taking one over right now). The outer condition re-checks on the row actually deleted; with the
    // bare clock there, it filters the batch's primary-key lookups and never draws the planner to a
    // second walk of the expires_at index.
    // A completed record goes when its retention ends. A record in progress goes only $2 ms after its
    // lease ended: a transactional handler may still be running for it, and its completion (a CAS on
    // the token alone) must find the row, since a lease that ran out with nobody taking the key over
    // is no failure. Deleting the row at once would turn that commit into { committed: false }.
    purge: named(
      'purge',
      `DELETE FROM ${t} WHERE id IN (
  SELECT id FROM ${t} WHERE ${purgeable(purgeClock)} ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) AND ${purgeable(clock)}`,
    ),
  };
}
