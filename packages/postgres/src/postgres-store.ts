import { createHash } from 'node:crypto';
import {
  type AsyncStore,
  assertKnownOptions,
  assertStoreId,
  assertStoreString,
  type ClaimInput,
  type ClaimResult,
  type CompleteInput,
  type ForgetInput,
  type ReleaseInput,
  type RenewInput,
  ResponseTooLargeError,
  responseLimit,
  StoreContendedError,
  type StoredResponse,
  type StoreRecord,
  StoreUnavailableError,
  storedResponseSize,
  TransactionAbortedError,
  type TransactionalStore,
} from '@idem/core';
import { retrySerializationFailures } from './serialization-retry.js';
import { createSqlClient, type PostgresClient, type SqlExecutor, type SqlResult } from './sql-client.js';
import { buildStatements, type Statement, type Statements } from './statements.js';
import { statusMessageColumn } from './status-message-column.js';
import { defaultTable, parseTableName } from './table-name.js';

/**
 * What a transactional handler receives: run your own SQL in the same transaction that completes
 * the idempotency record. Parameters are positional (`$1`, `$2`, ...). The handle is dead once the
 * transaction ends; a query through a kept handle rejects.
 *
 * @example
 * await engine.transaction(lease, async (tx: PostgresTransaction) => {
 *   await tx.query('UPDATE accounts SET balance = balance - $1 WHERE id = $2', [amount, accountId]);
 *   return { value: undefined, response };
 * });
 */
export type PostgresTransaction = SqlExecutor;

/**
 * Options of {@link postgresStore}.
 *
 * @example
 * const options: PostgresStoreOptions = { client: pool, table: 'billing.idem_records' };
 */
export interface PostgresStoreOptions {
  /**
   * A `pg` Pool (recommended for servers), a connected `pg` Client, or a PGlite instance. The caller
   * owns it: connects, ends, and (for a Pool) listens for its `'error'` events, which pg emits when an
   * idle connection dies and which crash the process when nobody listens.
   */
  client: PostgresClient;
  /** The records table, `name` or `schema.name`, created by {@link migrate}. Default `idem_records`. */
  table?: string | undefined;
  /**
   * Use named prepared statements on pg, parsed once per connection. Default true. Behind a pooler
   * that cannot keep them (PgBouncer in transaction mode before 1.21, or with
   * `max_prepared_statements = 0`) the first statement the server session lost is sent again
   * unnamed, and so is every statement after it; pass false there to skip that first round trip.
   */
  preparedStatements?: boolean | undefined;
  /**
   * Largest response (status, headers and body, as `storedResponseSize` measures it) that is stored.
   * A bigger one is refused with `ResponseTooLargeError` (the engine then releases the key); the
   * adapters read the cap from the store and settle such a response before they ask it (served, not
   * stored, and by default the key kept with `500 response_not_replayable`). Default 4 MiB, as the Redis store; at most 256 MiB less 64 KiB, because pg reads a
   * `bytea` back as hex text and a JavaScript string cannot hold a larger one.
   */
  maxResponseBytes?: number | undefined;
}

/**
 * Options of {@link PostgresStore.purgeExpired}.
 *
 * @example
 * await store.purgeExpired({ batchSize: 500, inProgressGraceMs: 15 * 60_000 });
 */
export interface PurgeOptions {
  /** Most rows deleted by this call. Default 1000. */
  batchSize?: number | undefined;
  /**
   * How long after it expired (its lease ended, and the keep after it: for a claim made by the engine,
   * the retention) a record still in progress is kept, in ms. Default one hour.
   * A transactional handler that outlives its lease still commits when nobody took the key over;
   * it needs the record's row to be there. Completed records go as soon as their retention ends.
   */
  inProgressGraceMs?: number | undefined;
}

/**
 * The PostgreSQL store: the Store contract, transactional mode, and purging.
 *
 * @example
 * const store: PostgresStore = postgresStore({ client: pool });
 * const deleted = await store.purgeExpired();
 */
export interface PostgresStore extends AsyncStore, Pick<TransactionalStore<PostgresTransaction>, 'transaction'> {
  /** The table this store uses, as given. */
  readonly table: string;
  /** The largest response stored (option `maxResponseBytes`, 4 MiB by default). */
  readonly maxResponseBytes: number;
  /** Always there on this store: `DELETE ... WHERE id AND token AND not expired` (see {@link AsyncStore.forget}). */
  forget(input: ForgetInput): Promise<boolean>;
  /**
   * Deletes up to `batchSize` records whose retention has run out, or which, still in progress,
   * expired (lease and keep) more than `inProgressGraceMs` ago, and resolves to how many it
   * deleted. Expired records are already invisible; this only reclaims space. Call it from a timer
   * or cron, again while it returns `batchSize`.
   */
  purgeExpired(options?: PurgeOptions): Promise<number>;
}

interface RecordRow {
  state: 'in_progress' | 'completed';
  token: string;
  fingerprint: string;
  status: number | null;
  headers: Record<string, string> | null;
  body: Uint8Array | null;
  /** The handler's own reason phrase; absent from the row when the table has no column for it yet. */
  status_message?: string | null;
  /** A record in progress whose lease ran out unrenewed. */
  abandoned: boolean;
}

interface ClaimRow extends Omit<RecordRow, 'state'> {
  claimed: boolean;
  state: RecordRow['state'] | null;
}

// A claim returns no row only when the record it conflicted with was committed after the
// statement's snapshot (see statements.ts); a fresh statement sees it. More than a few rounds in a
// row would mean a pathological churn of claims and releases on one id.
const claimAttempts = 5;

// A record in progress whose lease ended is purged only this long afterwards (PurgeOptions). Its
// executor may be a transactional handler still running, bounded by nothing but statement_timeout,
// and a row in progress is small: an hour of them costs little, a purged one costs a whole commit.
const defaultInProgressGraceMs = 60 * 60 * 1000;

const toRecord = (row: RecordRow): StoreRecord => {
  if (row.state === 'completed') {
    // complete() always writes all three. A completed row without one was written by something else
    // (a hand-rolled tool, a migration): read as 0, {} or an empty body it would replay a 201 with no
    // body, or make writeHead throw. It is no answer: the engine answers 503 (see record-check.ts).
    if (row.status === null || row.headers === null || row.body === null) {
      throw new StoreUnavailableError('PostgreSQL holds a completed record without its status, headers or body');
    }
    return {
      state: 'completed',
      token: row.token,
      fingerprint: row.fingerprint,
      response: {
        status: row.status,
        headers: row.headers,
        // pg hands back a Buffer, PGlite a Uint8Array; a plain copy is the same for both and does not
        // pin the driver's receive buffer.
        body: new Uint8Array(row.body),
        // NULL for the status's default phrase, and for a record written without the column (by an
        // earlier version, or before migrate() added it): its replay says the default phrase.
        ...(typeof row.status_message === 'string' ? { statusMessage: row.status_message } : {}),
      },
    };
  }
  return { state: row.abandoned ? 'abandoned' : 'in_progress', token: row.token, fingerprint: row.fingerprint };
};

// A table that is not there, or lacks a column this version uses (`lease_until`, added by a later
// version's migrate()): a deployment mistake, not an outage, and every statement fails the same way
// until someone migrates, so the error says how to fix it. It keeps the SQLSTATE as its `code` (the
// engine answers 503 as for any store failure; the message reaches its store-error event).
const unmigrated = (error: unknown, table: string): Error | undefined => {
  const code = (error as { code?: unknown } | null)?.code;
  if (code !== '42P01' && code !== '42703') return undefined;
  return Object.assign(
    new Error(
      `PostgreSQL table ${table} is missing or predates this version of @idem/postgres: run migrate() (or schema.sql) before deploying it`,
      { cause: error },
    ),
    { code },
  );
};

// 25P02 (in_failed_sql_transaction) on the completion inside a transactional handler's transaction:
// a statement of the handler's failed and the handler went on without rolling back to a SAVEPOINT
// (a unique violation caught and ignored), so PostgreSQL refuses everything until the transaction
// ends. The completion is the first statement of the store's own there, so this can only be the
// handler's doing: told apart from a store failure, the engine does not answer 503 for it (a retry
// would fail the same way, for ever) nor report a store-error.
const abortedByHandler = (error: unknown): Error | undefined => {
  if ((error as { code?: unknown } | null)?.code !== '25P02') return undefined;
  return new TransactionAbortedError(
    'The handler left its transaction aborted: one of its statements failed and it went on without rolling back to a SAVEPOINT; nothing was committed',
    { cause: error },
  );
};

// 42703 (undefined_column) naming `status_message`: a table that lost the column after the store saw it.
// Told by the message, as PostgreSQL's error names the column it did not find (on the error itself,
// or on the cause `unmigrated` keeps).
const mentionsPhraseColumn = (error: unknown): boolean => {
  if ((error as { code?: unknown } | null)?.code !== '42703') return false;
  const said = (value: unknown) => {
    const message = (value as { message?: unknown } | null)?.message;
    return typeof message === 'string' && message.includes('status_message');
  };
  return said(error) || said((error as { cause?: unknown }).cause);
};

// A statement that names `status_message` failed in a way a change of the column since the store
// saw it explains: gone (42703, above), or of another type (ALTER COLUMN ... TYPE, a bad manual
// migration). Another type fails the claim's UNION and the completion's SET with 42804
// (datatype_mismatch), a varchar(n) the completion of a longer phrase with 22001 (no other column a
// completion writes is a string). (The get reads it as text, so its result type never changes.) The
// codes do not name the column, so the statement runs again without it: if the column was the cause
// that one succeeds, and an unrelated failure fails again the same way and is thrown.
const phraseColumnChanged = (error: unknown, operation: string): boolean => {
  const code = (error as { code?: unknown } | null)?.code;
  if (code === '42804') return true;
  if (code === '22001') return operation === 'complete' || operation === 'complete_tx';
  return mentionsPhraseColumn(error);
};

// A duration becomes an interval added to (or, the purge's grace, taken from) the database's clock,
// and PostgreSQL's timestamps run from 4713 BC to 294276 AD: far past them a statement fails with
// "interval out of range" (22008). A thousand years is more than any lease, retention or grace, and
// well inside them either way. (The engine's own limits are 7 days of lease, 3650 of retention.)
const maxMs = 1000 * 365.25 * 24 * 60 * 60 * 1000;

const checkMs = (value: unknown, what: string) => {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0 || value > maxMs) {
    throw new TypeError(`${what} must be a positive number of milliseconds, at most ${maxMs} (1000 years)`);
  }
};

// pg reads a bytea as hex text ('\x' and two characters a byte) into one JavaScript string, and V8
// strings stop at 2^29 - 24 characters: a body of 256 MiB or more would be written, then fail every
// read of its key (pg throws in its socket handler) until its retention ended. Kept 64 KiB below.
const POSTGRES_RESPONSE_LIMIT = 256 * 1024 * 1024 - 64 * 1024;

const knownOptions: ReadonlySet<string> = new Set<keyof PostgresStoreOptions>([
  'client',
  'table',
  'preparedStatements',
  'maxResponseBytes',
]);
const knownPurgeOptions: ReadonlySet<string> = new Set<keyof PurgeOptions>(['batchSize', 'inProgressGraceMs']);

/**
 * Creates the PostgreSQL {@link Store} for a `pg` Pool or Client, or for PGlite (the embedded
 * default): the same SQL on all three. Every time is the database's own clock; every operation is one
 * statement. Run {@link migrate} (or `schema.sql`) first: construction never runs DDL.
 *
 * Transactional mode: `store.transaction({ id, token }, fn)` runs `fn(tx)` in one transaction (a
 * dedicated connection of the Pool; PGlite's transaction) and completes the record in that same
 * transaction, so the handler's writes and the stored response commit together or not at all.
 *
 * @example
 * import pg from 'pg';
 * import { createIdempotency } from '@idem/core';
 * import { migrate, postgresStore } from '@idem/postgres';
 *
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 * pool.on('error', (error) => log.warn({ error }, 'idle PostgreSQL connection lost'));
 * await migrate(pool);
 * const engine = createIdempotency({ store: postgresStore({ client: pool }) });
 *
 * @example
 * import { PGlite } from '@electric-sql/pglite';
 * const db = new PGlite(); // in memory; new PGlite('./data') keeps it on disk
 * await migrate(db);
 * const store = postgresStore({ client: db });
 */
export function postgresStore(options: PostgresStoreOptions): PostgresStore {
  return postgresStoreOnClock(options, monotonicClock);
}

// What the store times itself (when to ask the catalog again, status-message-column.ts) needs a clock
// that only moves forward: the wall clock stepped back by NTP, or by a VM resumed, would put the next
// question off by as long. Record times are never the process's: they are the database's.
const monotonicClock = () => performance.now();

/**
 * {@link postgresStore} on a given clock (milliseconds) for what the store times itself: tests inject
 * one. Not exported from the package.
 *
 * @example
 * let now = 0;
 * const store = postgresStoreOnClock({ client: db }, () => now);
 * now += 30_000; // the store asks the catalog again for a column it found missing
 */
export function postgresStoreOnClock(options: PostgresStoreOptions, now: () => number): PostgresStore {
  if (!options || typeof options !== 'object') throw new TypeError('postgresStore needs an options object');
  assertKnownOptions(options, knownOptions, 'postgresStore');
  const table = parseTableName(options.table ?? defaultTable);
  const maxResponseBytes = responseLimit(options.maxResponseBytes, POSTGRES_RESPONSE_LIMIT, 'maxResponseBytes');
  // Before any statement: an oversized response leaves the claim as it was, and the engine releases
  // it so a retry runs instead of waiting out the lease. (The engine checked the response's shape.)
  const checkSize = (response: StoredResponse) => {
    const bytes = storedResponseSize(response);
    if (bytes > maxResponseBytes) throw new ResponseTooLargeError(bytes, maxResponseBytes);
  };
  const sql = createSqlClient(options.client, { preparedStatements: options.preparedStatements ?? true });
  const tag = createHash('sha256').update(table.name).digest('hex').slice(0, 12);
  const withPhrase = buildStatements(table, tag, { statusMessage: true });
  const withoutPhrase = buildStatements(table, tag, { statusMessage: false });
  // Which of the two a call uses: see status-message-column.ts (a table not yet migrated).
  const phraseColumn = statusMessageColumn(sql, table, tag, now);
  const statementsNow = async (operation: string): Promise<Statements> =>
    (await phraseColumn.present(operation)) ? withPhrase : withoutPhrase;

  // Each of these statements runs in a transaction of its own, so one that failed with a
  // serialization failure (REPEATABLE READ or SERIALIZABLE sessions) had no effect and runs again
  // with a fresh snapshot: see serialization-retry.ts. The transactional mode's statements never
  // come through here.
  const runOnce = <Row>(statement: Statement, params: unknown[]): Promise<SqlResult<Row>> =>
    retrySerializationFailures(() => sql.run<Row>(statement, params)).catch((error: unknown) => {
      throw unmigrated(error, table.name) ?? error;
    });

  // Runs the statement `pick` chooses from the set in use. The column found gone or of another type
  // after it was seen (dropped again, a migration rolled back, its type altered by hand): the
  // statement without it runs instead, and the next calls ask the catalog again in a while, which
  // refuses a column of the wrong type as it would a missing one. `params` takes the set, since
  // `complete` has one more. (Statements whose text is the same in both sets never name the column.)
  const run = async <Row>(
    pick: (set: Statements) => Statement,
    params: (set: Statements) => unknown[],
  ): Promise<SqlResult<Row>> => {
    const set = await statementsNow(pick(withPhrase).operation);
    try {
      return await runOnce<Row>(pick(set), params(set));
    } catch (error) {
      const statement = pick(withPhrase);
      if (set === withoutPhrase || statement.text === pick(withoutPhrase).text) throw error;
      if (!phraseColumnChanged(error, statement.operation)) throw error;
      phraseColumn.missing();
      return runOnce<Row>(pick(withoutPhrase), params(withoutPhrase));
    }
  };

  const claim = async ({
    id,
    token,
    fingerprint,
    leaseMs,
    keepAfterLeaseMs = 0,
    replaces,
  }: ClaimInput): Promise<ClaimResult> => {
    // `text` cannot hold U+0000 (22021, a raw driver error answered 503), and pg sends a lone surrogate
    // as U+FFFD, so "a\ud800" and "a\udc00" were one record, and one token passed another's fence:
    // refused before any statement, as every store refuses them (assertStoreId in @idem/core), here
    // and in every method below.
    assertStoreId(id, 'id');
    assertStoreId(token, 'token');
    checkMs(leaseMs, 'leaseMs');
    if (keepAfterLeaseMs !== 0) checkMs(keepAfterLeaseMs, 'keepAfterLeaseMs');
    if (replaces !== undefined) assertStoreId(replaces, 'replaces');
    assertStoreString(fingerprint, 'fingerprint');
    const params = [id, token, fingerprint, leaseMs, keepAfterLeaseMs, replaces ?? null];
    for (let attempt = 0; attempt < claimAttempts; attempt++) {
      const { rows } = await run<ClaimRow>(
        (set) => set.claim,
        () => params,
      );
      const row = rows[0];
      if (row === undefined) continue;
      if (row.claimed) return { claimed: true };
      return { claimed: false, record: toRecord(row as RecordRow) };
    }
    // PostgreSQL answered every time: the key is live elsewhere, churning. Not "unavailable": under
    // fail-open that would run a duplicate beside its holder.
    throw new StoreContendedError('PostgreSQL store could not settle a claim; the record kept changing');
  };

  const renew = async ({ id, token, leaseMs }: RenewInput): Promise<boolean> => {
    assertStoreId(id, 'id');
    assertStoreId(token, 'token');
    checkMs(leaseMs, 'leaseMs');
    const { rowCount } = await run(
      (set) => set.renew,
      () => [id, token, leaseMs],
    );
    return rowCount > 0;
  };

  const completeParams = (
    set: Statements,
    id: string,
    token: string,
    response: StoredResponse,
    retentionMs: number,
  ): unknown[] => {
    const params = [id, token, response.status, JSON.stringify(response.headers ?? {}), response.body, retentionMs];
    return set === withPhrase ? [...params, response.statusMessage ?? null] : params;
  };

  const complete = async ({ id, token, response, retentionMs }: CompleteInput): Promise<boolean> => {
    assertStoreId(id, 'id');
    assertStoreId(token, 'token');
    checkSize(response);
    checkMs(retentionMs, 'retentionMs');
    const { rowCount } = await run(
      (set) => set.complete,
      (set) => completeParams(set, id, token, response, retentionMs),
    );
    return rowCount > 0;
  };

  const release = async ({ id, token }: ReleaseInput): Promise<boolean> => {
    assertStoreId(id, 'id');
    assertStoreId(token, 'token');
    const { rowCount } = await run(
      (set) => set.release,
      () => [id, token],
    );
    return rowCount > 0;
  };

  const forget = async ({ id, token }: ForgetInput): Promise<boolean> => {
    assertStoreId(id, 'id');
    assertStoreId(token, 'token');
    const { rowCount } = await run(
      (set) => set.forget,
      () => [id, token],
    );
    return rowCount > 0;
  };

  const get = async (id: string): Promise<StoreRecord | undefined> => {
    assertStoreId(id, 'id');
    const { rows } = await run<RecordRow>(
      (set) => set.get,
      () => [id],
    );
    const row = rows[0];
    return row === undefined ? undefined : toRecord(row);
  };

  const purgeExpired = async (options: PurgeOptions = {}): Promise<number> => {
    assertKnownOptions(options, knownPurgeOptions, 'purgeExpired');
    const { batchSize = 1000, inProgressGraceMs = defaultInProgressGraceMs } = options;
    // A safe integer: a larger one is past PostgreSQL's bigint (22003), and none is a count of rows.
    if (!Number.isSafeInteger(batchSize) || batchSize < 1) {
      throw new TypeError(`batchSize must be a positive safe integer (at most ${Number.MAX_SAFE_INTEGER})`);
    }
    if (
      typeof inProgressGraceMs !== 'number' ||
      !Number.isFinite(inProgressGraceMs) ||
      inProgressGraceMs < 0 ||
      inProgressGraceMs > maxMs
    ) {
      throw new TypeError(
        `inProgressGraceMs must be a number of milliseconds, 0 or more, at most ${maxMs} (1000 years)`,
      );
    }
    const { rowCount } = await run(
      (set) => set.purge,
      () => [batchSize, inProgressGraceMs],
    );
    return rowCount;
  };

  const transaction: PostgresStore['transaction'] = async <T>(
    input: { id: string; token: string },
    fn: (tx: PostgresTransaction) => Promise<{ value: T; response: StoredResponse | undefined; retentionMs: number }>,
  ) => {
    assertStoreId(input?.id, 'id');
    assertStoreId(input?.token, 'token');
    const { id, token } = input;
    type Outcome = { committed: true; value: T } | { committed: false };
    // Chosen before the transaction opens: asking the catalog inside it could only add a way for the
    // handler's transaction to fail.
    const set = await statementsNow('transaction');
    // A COMMIT refused by a deferred constraint rejects from the SQL client as the handler's
    // TransactionAbortedError already.
    return sql.transaction<Outcome>(async (tx) => {
      const produced = await fn(tx);
      const response = produced.response;
      if (response !== undefined) {
        checkSize(response);
        checkMs(produced.retentionMs, 'retentionMs');
      }
      const cas = await (response === undefined
        ? tx.query(set.releaseInTransaction.text, [id, token])
        : tx.query(set.completeInTransaction.text, completeParams(set, id, token, response, produced.retentionMs))
      ).catch((error: unknown) => {
        // The column gone or of another type since it was seen: this transaction is lost (503; its
        // statement cannot run again in a transaction the failure aborted), the next ones store
        // without the phrase.
        if (
          set === withPhrase &&
          response !== undefined &&
          phraseColumnChanged(error, set.completeInTransaction.operation)
        ) {
          phraseColumn.missing();
        }
        throw abortedByHandler(error) ?? error;
      });
      // The token is no longer current: someone else owns the record, so nothing of this run may
      // commit, neither the handler's writes nor the outcome.
      if (cas.rowCount === 0) return { commit: false, value: { committed: false } };
      return { commit: true, value: { committed: true, value: produced.value } };
    });
  };

  return {
    table: table.name,
    maxResponseBytes,
    claim,
    renew,
    complete,
    release,
    forget,
    get,
    transaction,
    purgeExpired,
  };
}
