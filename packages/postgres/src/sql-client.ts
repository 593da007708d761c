import { TransactionAbortedError } from '@idem/core';
import type { Statement } from './statements.js';
import { storeParsers, storeTypes } from './store-types.js';
import { isTransientDatabaseError, toStoreError } from './unavailable.js';

/**
 * Rows and the number of rows a statement touched, the same shape for pg and PGlite.
 *
 * @example
 * const { rows, rowCount }: SqlResult<{ id: number }> = await tx.query('DELETE FROM carts WHERE user_id = $1 RETURNING id', [userId]);
 */
export interface SqlResult<Row = Record<string, unknown>> {
  rows: Row[];
  rowCount: number;
}

/**
 * What the store and a transactional handler can run: one statement with positional parameters.
 *
 * @example
 * const { rows } = await tx.query<{ id: string }>('INSERT INTO orders (total) VALUES ($1) RETURNING id', [total]);
 */
export interface SqlExecutor {
  query<Row = Record<string, unknown>>(text: string, params?: readonly unknown[]): Promise<SqlResult<Row>>;
}

/**
 * The subset of a `pg` query config the store uses.
 *
 * @example
 * const config: PgQueryConfig = { name: 'idem_get', text: 'SELECT 1', values: [] };
 */
export interface PgQueryConfig {
  text: string;
  values?: unknown[];
  name?: string;
  /** The parsers of this query's columns, in place of pg's process-wide ones (see store-types.ts). */
  types?: typeof storeTypes | undefined;
}

/**
 * The subset of a `pg` result the store reads.
 *
 * @example
 * const { rowCount }: PgQueryResult = await pool.query('SELECT 1');
 */
export interface PgQueryResult {
  rows: any[];
  rowCount: number | null;
}

/**
 * A connection checked out of a `pg` Pool (`PoolClient`).
 *
 * @example
 * const connection: PgPoolClientLike = await pool.connect();
 */
export interface PgPoolClientLike {
  query(config: PgQueryConfig): Promise<PgQueryResult>;
  release(destroy?: boolean | Error): void;
  on(event: 'error', listener: (error: Error) => void): unknown;
  removeListener(event: 'error', listener: (error: Error) => void): unknown;
}

/**
 * A `pg` Pool. The caller creates, configures and ends it, and listens for its `'error'` events.
 *
 * @example
 * import pg from 'pg';
 * const pool: PgPoolLike = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 */
export interface PgPoolLike {
  query(config: PgQueryConfig): Promise<PgQueryResult>;
  connect(
    callback: (error: Error | undefined, client: PgPoolClientLike | undefined, done: (release?: any) => void) => void,
  ): void;
  readonly totalCount: number;
  readonly idleCount: number;
}

/**
 * A single connected `pg` Client (or a `PoolClient` the caller keeps checked out). The store runs
 * one statement or transaction at a time on it; a Pool serves concurrent requests better.
 *
 * @example
 * import pg from 'pg';
 * const client = new pg.Client({ connectionString });
 * await client.connect();
 * const store = postgresStore({ client }); // a PgClientLike
 */
export interface PgClientLike {
  query(config: PgQueryConfig): Promise<PgQueryResult>;
}

/**
 * The subset of PGlite's per-query options the store uses: its own parsers, over the instance's.
 *
 * @example
 * const options: PGliteQueryOptions = { parsers: { 16: (text) => text === 't' } };
 */
export interface PGliteQueryOptions {
  parsers?: Readonly<Record<number, (text: string, typeId: number) => unknown>> | undefined;
}

/**
 * The handle PGlite passes to `transaction()` callbacks.
 *
 * @example
 * await db.transaction(async (tx: PGliteTransactionLike) => tx.query('SELECT 1'));
 */
export interface PGliteTransactionLike {
  query<Row>(
    text: string,
    params?: any[],
    options?: PGliteQueryOptions,
  ): Promise<{ rows: Row[]; affectedRows?: number }>;
  rollback(): Promise<void>;
}

/**
 * A PGlite instance (`@electric-sql/pglite`), in memory or on disk.
 *
 * @example
 * import { PGlite } from '@electric-sql/pglite';
 * const db: PGliteLike = new PGlite('./idem-data');
 */
export interface PGliteLike {
  query<Row>(
    text: string,
    params?: any[],
    options?: PGliteQueryOptions,
  ): Promise<{ rows: Row[]; affectedRows?: number }>;
  // What it resolves to is not used: PGlite before 0.2.16 declares `Promise<T | undefined>`.
  transaction<T>(callback: (tx: PGliteTransactionLike) => Promise<T>): Promise<unknown>;
  /** Read after each statement of a transactional handler, where PGlite has it. */
  isInTransaction?: (() => boolean) | undefined;
}

/**
 * Any client the PostgreSQL store accepts: a `pg` Pool, a `pg` Client, or PGlite.
 *
 * @example
 * import { PGlite } from '@electric-sql/pglite';
 * import pg from 'pg';
 * const client: PostgresClient = process.env.DATABASE_URL ? new pg.Pool({ connectionString: process.env.DATABASE_URL }) : new PGlite();
 */
export type PostgresClient = PgPoolLike | PgClientLike | PGliteLike;

/** Which kind of client a {@link SqlClient} wraps. */
export type SqlClientKind = 'pg-pool' | 'pg-client' | 'pglite';

/** The outcome `fn` hands back to {@link SqlClient.transaction}: commit or roll back, and a value. */
export interface TransactionDecision<T> {
  commit: boolean;
  value: T;
}

/**
 * The one shim between the store and its driver: the same SQL runs through it on pg and PGlite.
 * Infrastructure failures reject with `StoreUnavailableError`; SQL errors pass through unchanged.
 */
export interface SqlClient extends SqlExecutor {
  readonly kind: SqlClientKind;
  /**
   * Runs one statement, as a named prepared statement where the driver supports it. A failure is
   * reported under `statement.operation` (`claim`), not its prepared name, which is a hash.
   */
  run<Row = Record<string, unknown>>(statement: Statement, params: readonly unknown[]): Promise<SqlResult<Row>>;
  /**
   * Runs `fn` inside BEGIN ... COMMIT on one connection; `fn` decides commit or rollback. If `fn`
   * throws, the transaction rolls back and the error propagates unchanged.
   */
  transaction<T>(fn: (tx: SqlExecutor) => Promise<TransactionDecision<T>>): Promise<T>;
}

/** Options of {@link createSqlClient}. */
export interface SqlClientOptions {
  /** Use named prepared statements on pg (parsed once per connection). Default true. */
  preparedStatements?: boolean;
  /**
   * Read the rows of `transaction()`'s queries with the store's own parsers too, as migrate() does
   * for its catalog reads. Default false: a transactional handler's queries are the application's,
   * read with its parsers. (The store's own statements always use the store's.)
   */
  storeTypesInTransactions?: boolean;
}

const isPGlite = (client: object): client is PGliteLike =>
  typeof (client as Partial<PGliteLike>).transaction === 'function' &&
  typeof (client as Partial<PGliteLike>).query === 'function';

const isPgPool = (client: object): client is PgPoolLike =>
  typeof (client as Partial<PgPoolLike>).connect === 'function' &&
  typeof (client as Partial<PgPoolLike>).totalCount === 'number' &&
  typeof (client as Partial<PgPoolLike>).idleCount === 'number';

// A pg Client keeps its config's `binary` as a property, a Pool in `options` for its clients.
const sendsBinary = (client: object): boolean =>
  (client as { binary?: unknown }).binary === true ||
  (client as { options?: { binary?: unknown } }).options?.binary === true;

// Rows are typed by the caller's query (`query<Row>`), so the shim itself handles them untyped.
type AnyResult = SqlResult<any>;

const fromPg = (result: PgQueryResult): AnyResult => ({
  rows: result.rows,
  rowCount: result.rowCount ?? 0,
});

const fromPGlite = (result: { rows: unknown[]; affectedRows?: number }): AnyResult => ({
  rows: result.rows,
  rowCount: result.affectedRows ?? result.rows.length,
});

const endedByHandler = () =>
  new TypeError(
    "tx.query ended the store's transaction (a COMMIT or ROLLBACK sent through it): the handler's statements and the record's completion commit together or not at all, so nothing more runs on this handle; throw from the handler to roll back",
  );

// A transaction handle must not outlive its transaction: after COMMIT the pg connection goes back to
// the pool, and a late query through a kept handle would run in some other request's session.
// Nor may the handler end the transaction itself: after a COMMIT or ROLLBACK sent through the handle
// the session runs in autocommit, so each later statement, the completion included, would commit on
// its own, whatever the fencing token said. `inTransaction` is the driver's own view of the session
// (pg's ReadyForQuery status, PGlite's as pgliteInTransaction reads it), read after each statement,
// `failed` when it threw: false once the transaction block is gone, undefined where the driver does
// not say. A statement that fails can end it too (a COMMIT refused by a deferred constraint or a
// serialization failure rolls back): its error goes on, and nothing more runs on the handle.
const guarded = (
  query: (text: string, params?: readonly unknown[]) => Promise<AnyResult>,
  isOpen: () => boolean,
  inTransaction: (failed: boolean) => boolean | undefined | Promise<boolean | undefined> = () => undefined,
): SqlExecutor => {
  let ended = false;
  return {
    query: async (text, params) => {
      if (!isOpen()) throw new TypeError('this transaction is over; run queries inside the callback');
      if (ended) throw endedByHandler();
      let result: AnyResult;
      try {
        result = await query(text, params);
      } catch (error) {
        // Best effort: the statement's own error is the one to report.
        if ((await Promise.resolve(inTransaction(true)).catch(() => undefined)) === false) ended = true;
        throw toStoreError(error, 'transaction query');
      }
      if ((await inTransaction(false)) === false) {
        ended = true;
        throw endedByHandler();
      }
      return result;
    },
  };
};

// PGlite's isInTransaction() follows the command tags it sees, BEGIN, COMMIT and ROLLBACK: it reads
// ROLLBACK TO SAVEPOINT (tagged ROLLBACK) as the end of the transaction, and a COMMIT that fails
// (no tag) as none. Where it says false, or after a statement that failed, the server is asked.
function pgliteInTransaction(
  db: PGliteLike,
  raw: PGliteTransactionLike,
  failed: boolean,
): boolean | undefined | Promise<boolean> {
  // A PGlite without it (an older one) is not checked, as before.
  if (typeof db.isInTransaction !== 'function') return undefined;
  if (!failed && db.isInTransaction()) return true;
  return askedInTransaction((text) => raw.query(text));
}

// Whether the session is still in a transaction block, asked of the server: SAVEPOINT is refused
// outside one (25P01), and in an aborted one (25P02), which is still one.
async function askedInTransaction(run: (text: string) => Promise<unknown>): Promise<boolean> {
  try {
    await run('SAVEPOINT idem_transaction_probe');
  } catch (error) {
    return (error as { code?: unknown }).code !== '25P01';
  }
  await run('RELEASE SAVEPOINT idem_transaction_probe');
  return true;
}

/**
 * Wraps a `pg` Pool, a `pg` Client or a PGlite instance in the store's {@link SqlClient} shim.
 * The caller keeps owning the client: the shim never connects, ends or closes it.
 *
 * @example
 * import pg from 'pg';
 * const sql = createSqlClient(new pg.Pool({ connectionString }));
 * const { rows } = await sql.query('SELECT 1 AS one');
 */
export function createSqlClient(client: PostgresClient, options: SqlClientOptions = {}): SqlClient {
  if (!client || typeof client !== 'object' || typeof (client as { query?: unknown }).query !== 'function') {
    throw new TypeError('client must be a pg Pool, a pg Client or a PGlite instance');
  }
  // pg's `binary: true` asks every result in binary format, and pg 8 decodes each field as UTF-8
  // text before parsing it: any byte of a bytea, an integer or a timestamp that is not valid UTF-8
  // comes back as U+FFFD, so a replay would differ from the answer stored (a 201 read back as 239).
  if (sendsBinary(client)) {
    throw new TypeError(
      'client was made with binary: true, which pg reads back lossily (each binary field is decoded as UTF-8 text): give the store a client without it',
    );
  }
  const prepared = options.preparedStatements ?? true;
  const transactionTypes = options.storeTypesInTransactions === true ? storeTypes : undefined;
  if (isPGlite(client)) return pgliteClient(client, transactionTypes !== undefined);
  if (isPgPool(client)) return pgPoolClient(client, prepared, transactionTypes);
  return pgSingleClient(client as PgClientLike, prepared, transactionTypes);
}

function pgliteClient(db: PGliteLike, storeTypesInTransactions: boolean): SqlClient {
  const own = { parsers: storeParsers };
  const query = async (text: string, params: readonly unknown[] = []) =>
    fromPGlite(await db.query(text, [...params], own));
  const inTransaction = storeTypesInTransactions ? own : undefined;
  return {
    kind: 'pglite',
    query: (text, params) =>
      query(text, params).catch((error) => {
        throw toStoreError(error, 'query');
      }),
    run: (statement, params) =>
      query(statement.text, params).catch((error) => {
        throw toStoreError(error, statement.operation);
      }),
    // PGlite is one connection; its transaction() holds a lock that makes every other query wait
    // until the transaction ends, so nothing else can slip into it.
    async transaction<T>(fn: (tx: SqlExecutor) => Promise<TransactionDecision<T>>): Promise<T> {
      let open = true;
      // Kept here, not taken from what transaction() resolves to, which a PGlite before 0.2.16
      // declares as possibly undefined (after a rollback, say).
      let value = undefined as T;
      // Set once fn has decided to commit: a failure after it is PGlite's COMMIT.
      let committing = false;
      try {
        await db.transaction(async (raw) => {
          const tx = guarded(
            async (text, params) => fromPGlite(await raw.query(text, params ? [...params] : [], inTransaction)),
            () => open,
            (failed) => pgliteInTransaction(db, raw, failed),
          );
          let decision: TransactionDecision<T>;
          try {
            decision = await fn(tx);
          } catch (error) {
            // PGlite rolls back on any exception; the wrapper keeps the handler's error apart from
            // the store's own failures so it is rethrown unchanged.
            throw new HandlerFailure(error);
          } finally {
            open = false;
          }
          value = decision.value;
          if (!decision.commit) await raw.rollback();
          else committing = true;
        });
        return value;
      } catch (error) {
        if (error instanceof HandlerFailure) throw error.error;
        if (committing && refusedAtCommit(error)) throw commitRefused(error);
        throw toStoreError(error, 'transaction');
      }
    },
  };
}

// Shared by the Pool and Client flavours: one connection, BEGIN, fn, COMMIT or ROLLBACK. Failures
// carry `broken` (the error that left the connection in an unknown state) for the clean-up.
async function runPgTransaction<T>(
  connection: { query(config: PgQueryConfig): Promise<PgQueryResult> },
  fn: (tx: SqlExecutor) => Promise<TransactionDecision<T>>,
  types: typeof storeTypes | undefined,
): Promise<T> {
  let open = true;
  // pg's status from the server's last ReadyForQuery: 'I' idle (no transaction block), 'T' in one,
  // 'E' in a failed one. An older pg without the method is not checked.
  const status = (connection as { getTransactionStatus?: () => unknown }).getTransactionStatus;
  const tx = guarded(
    async (text, params) =>
      fromPg(await connection.query({ text, values: params ? [...params] : [], ...(types && { types }) })),
    () => open,
    async (failed) => {
      if (typeof status !== 'function') return undefined;
      // pg rejects a failed statement before the server's ReadyForQuery arrives, so its status is
      // still the one from before: an empty query (answered in any state, an aborted one included,
      // with no error in the server's log) brings the current one.
      if (failed) await connection.query({ text: '' });
      const current = status.call(connection);
      return typeof current === 'string' ? current !== 'I' : undefined;
    },
  );
  try {
    await connection.query({ text: 'BEGIN' });
  } catch (error) {
    open = false;
    throw new ConnectionFailure(toStoreError(error, 'transaction begin'), error);
  }
  let decision: TransactionDecision<T>;
  try {
    decision = await fn(tx);
  } catch (error) {
    open = false;
    const broken = await connection.query({ text: 'ROLLBACK' }).then(
      () => undefined,
      (rollbackError: unknown) => rollbackError,
    );
    // The handler's own error is what the caller needs to see, even when the rollback failed too:
    // a connection that cannot roll back is destroyed, which aborts the transaction anyway.
    throw new HandlerFailure(error, broken);
  }
  open = false;
  try {
    await connection.query({ text: decision.commit ? 'COMMIT' : 'ROLLBACK' });
  } catch (error) {
    // Refused, the transaction is over and rolled back, and the connection is fine: kept.
    if (decision.commit && refusedAtCommit(error)) throw new HandlerFailure(commitRefused(error));
    // A COMMIT cut off by a dropped connection has an unknown outcome; the caller gets
    // store_unavailable, and a release() by the engine afterwards is a harmless no-op if it did commit.
    throw new ConnectionFailure(toStoreError(error, decision.commit ? 'commit' : 'rollback'), error);
  }
  return decision.value;
}

/**
 * A COMMIT the server refused for what the transaction's own statements queued for it (a deferred
 * unique or foreign key, a constraint trigger), not for an outage: it rolled back, and the same writes
 * would be refused again. The handler's own data failed, as if one of its statements had, only later:
 * no 503, no store-error; the adapters release the key so a corrected request can run.
 */
const commitRefused = (error: unknown) =>
  new TransactionAbortedError(
    "PostgreSQL refused to commit the handler's writes: a deferred constraint or constraint trigger failed at COMMIT; nothing was committed",
    { cause: error },
  );

// A COMMIT's failure that is the server's answer (it has a SQLSTATE) and no outage: the store's own
// statements had all run, so what COMMIT checked was deferred work of the handler's writes. One that
// failed for a transient reason (a connection lost, a serialization failure, a lock not had in time)
// stays a store failure: its outcome is unknown, or a retry may pass.
const refusedAtCommit = (error: unknown): boolean => {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) && !isTransientDatabaseError(error);
};

// Carries a handler's error through the clean-up so it is rethrown unchanged.
class HandlerFailure {
  constructor(
    readonly error: unknown,
    readonly broken?: unknown,
  ) {}
}

// Carries the store's error and the cause that broke the connection.
class ConnectionFailure {
  constructor(
    readonly error: unknown,
    readonly broken: unknown,
  ) {}
}

// Runs a pg transaction, hands `done` the error that broke the connection (if any) so the
// connection can be destroyed or returned, and unwraps the error to rethrow.
async function settle<T>(work: Promise<T>, done: (broken: unknown) => void): Promise<T> {
  try {
    const value = await work;
    done(undefined);
    return value;
  } catch (failure) {
    if (failure instanceof HandlerFailure || failure instanceof ConnectionFailure) {
      done(failure.broken);
      throw failure.error;
    }
    // fn's errors are all wrapped above; anything else is an unexpected failure of the shim itself.
    done(failure);
    throw failure;
  }
}

// A named statement that the server session does not have (26000) or already has under that name
// (42P05): the connection pg prepared it on is not the session the statement reached. That is what
// a pooler in transaction mode does (PgBouncer before 1.21, or with max_prepared_statements = 0):
// each transaction may run on another server session. Such a statement failed at Parse or Bind,
// before it ran, so sending it again unnamed runs it exactly once.
const lostPreparation = (error: unknown): boolean => {
  const code = (error as { code?: unknown } | null)?.code;
  return code === '42P05' || code === '26000';
};

/**
 * Sends named prepared statements until the first one is lost (see {@link lostPreparation}), then
 * sends that one again, and every statement after it, unnamed: behind such a pooler preparing
 * cannot work, and each fresh pg connection would otherwise fail its statements anew.
 */
function preparing(
  send: (config: PgQueryConfig) => Promise<AnyResult>,
  prepared: boolean,
): (name: string, text: string, params: readonly unknown[]) => Promise<AnyResult> {
  let named = prepared;
  return async (name, text, params) => {
    if (named) {
      try {
        return await send({ name, text, values: [...params], types: storeTypes });
      } catch (error) {
        if (!lostPreparation(error)) throw error;
        named = false;
      }
    }
    return send({ text, values: [...params], types: storeTypes });
  };
}

function pgPoolClient(pool: PgPoolLike, prepared: boolean, transactionTypes: typeof storeTypes | undefined): SqlClient {
  const query = async (text: string, params: readonly unknown[] = []) =>
    fromPg(await pool.query({ text, values: [...params], types: storeTypes }));
  const run = preparing(async (config) => fromPg(await pool.query(config)), prepared);
  return {
    kind: 'pg-pool',
    query: (text, params) =>
      query(text, params).catch((error) => {
        throw toStoreError(error, 'query');
      }),
    run: (statement, params) =>
      run(statement.name, statement.text, params).catch((error) => {
        throw toStoreError(error, statement.operation);
      }),
    // A dedicated connection for the whole transaction: the heartbeat and other requests keep
    // using the rest of the pool meanwhile.
    async transaction<T>(fn: (tx: SqlExecutor) => Promise<TransactionDecision<T>>): Promise<T> {
      // A checked-out pg client emits 'error' when its backend dies between queries (for example
      // pg_terminate_backend while the handler awaits something else); unheard, that event crashes
      // the process. The listener goes on inside connect's callback, synchronously: with the promise
      // form it would come a microtask late, and pg can hand over a connection whose socket still
      // holds an unread "terminating connection" message, parsed in the same tick.
      let lost: Error | undefined;
      const onError = (error: Error) => {
        lost = error;
      };
      let connection: PgPoolClientLike;
      try {
        connection = await new Promise<PgPoolClientLike>((resolve, reject) => {
          pool.connect((error, client) => {
            if (error || !client) return reject(error ?? new Error('pg Pool returned no client'));
            client.on('error', onError);
            resolve(client);
          });
        });
      } catch (error) {
        throw toStoreError(error, 'transaction connect');
      }
      return settle(runPgTransaction(connection, fn, transactionTypes), (broken) => {
        connection.removeListener('error', onError);
        const reason = broken ?? lost;
        // A connection that failed mid-transaction is in an unknown state: destroy it rather than
        // hand it back to the pool.
        connection.release(reason instanceof Error ? reason : reason === undefined ? undefined : true);
      });
    },
  };
}

type Exclusive = <T>(work: () => Promise<T>) => Promise<T>;

// One turn queue per pg Client object, shared by every store and migrate() call on that client, so
// two stores (or a store and a migration) on one connection cannot interleave either.
const turns = new WeakMap<object, Exclusive>();

const turnsOf = (client: object): Exclusive => {
  const existing = turns.get(client);
  if (existing) return existing;
  let tail: Promise<unknown> = Promise.resolve();
  const exclusive: Exclusive = (work) => {
    const turn = tail.then(work, work);
    tail = turn.catch(() => undefined);
    return turn;
  };
  turns.set(client, exclusive);
  return exclusive;
};

function pgSingleClient(
  client: PgClientLike,
  prepared: boolean,
  transactionTypes: typeof storeTypes | undefined,
): SqlClient {
  // One connection shared by everything, so one statement or transaction at a time, in call order.
  // A transaction holds the turn from BEGIN to COMMIT: the store's other statements (claims for
  // other keys, heartbeats) wait, or they would run inside it and vanish with its rollback. pg 8
  // would queue concurrent queries itself, but that is deprecated and goes away in pg 9.
  const exclusive = turnsOf(client);
  const query = (config: PgQueryConfig): Promise<AnyResult> =>
    exclusive(async () => fromPg(await client.query(config)));
  const run = preparing(query, prepared);
  return {
    kind: 'pg-client',
    query: (text, params) =>
      query({ text, values: params ? [...params] : [], types: storeTypes }).catch((error) => {
        throw toStoreError(error, 'query');
      }),
    run: (statement, params) =>
      run(statement.name, statement.text, params).catch((error) => {
        throw toStoreError(error, statement.operation);
      }),
    transaction: <T>(fn: (tx: SqlExecutor) => Promise<TransactionDecision<T>>): Promise<T> =>
      exclusive(() => settle(runPgTransaction(client, fn, transactionTypes), () => undefined)),
  };
}
