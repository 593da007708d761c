import { createHash } from 'node:crypto';
import { type Duration, retryWithPauses, StoreUnavailableError, toMilliseconds } from '@idem/core';
import { createSqlClient, type PostgresClient } from './sql-client.js';
import { defaultTable, parseTableName, type TableName } from './table-name.js';

// PostgreSQL cuts every identifier to 63 bytes. `<table>_expires_at` for a table name of more than
// 52 characters would be cut to a name that another relation can already have: the table itself,
// for a 63-character name, or a sibling table sharing the first 52 characters. CREATE INDEX IF NOT
// EXISTS then skips silently, and purgeExpired() scans the whole table. A name that does not fit
// keeps the table's first characters and ends in a hash of the whole table name.
const maxIdentifier = 63;
const indexSuffix = '_expires_at';

const expiresAtIndex = (table: TableName): string => {
  const plain = `${table.base}${indexSuffix}`;
  if (plain.length <= maxIdentifier) return plain;
  const hash = createHash('sha256').update(table.base).digest('hex').slice(0, 8);
  return `${table.base.slice(0, maxIdentifier - indexSuffix.length - hash.length - 1)}_${hash}${indexSuffix}`;
};

// The type each column must have, as PostgreSQL names it (`atttypid::regtype`), and why it matters:
// every column is read or compared by the store. `body` as text would store a body as its hex text
// and replay other bytes; `status` as bigint reads back as a string; `headers` as json or text fails
// the `$4::jsonb` write; timestamps as text fail every claim (no text > timestamptz), and `timestamp`
// without a zone would be compared through each session's TimeZone. varchar without a length is the
// same as text to PostgreSQL, so it passes too, and so does one at least as long as what the store
// writes (hand-made tables often say varchar(255)): a fingerprint is 64 hex digits, a record id 43
// characters, a token at most 33, a state 11. `status_message`, a reason phrase of any length the
// handler chose, must be text or varchar without a length: a shorter one would refuse a long phrase
// at completion.
const minVarcharLength = 64;
const columnTypes: Readonly<Record<string, readonly string[]>> = {
  id: ['text', 'character varying'],
  state: ['text', 'character varying'],
  token: ['text', 'character varying'],
  fingerprint: ['text', 'character varying'],
  status: ['integer'],
  headers: ['jsonb'],
  body: ['bytea'],
  expires_at: ['timestamp with time zone'],
  lease_until: ['timestamp with time zone'],
  status_message: ['text', 'character varying'],
};

// Columns a later version added, which migrate() adds to a table made before them.
const addedLater: ReadonlySet<string> = new Set(['lease_until', 'status_message']);

// The columns every claim's INSERT writes. The store's others it leaves NULL (no status, headers or
// body while in progress, no lease_until for a claim without a keep, no phrase), and sets back to
// NULL when it takes a record over, so they must be nullable, default or not; a column of the
// application's own it never writes, so one that is NOT NULL needs a default (or to be generated).
const alwaysWritten: ReadonlySet<string> = new Set(['id', 'state', 'token', 'fingerprint', 'expires_at']);

/** One column of an existing table, as the catalog describes it. */
interface FoundColumn {
  /** The type as `regtype` names it. */
  type: string;
  /** The type as `format_type` prints it, with its length. */
  display: string;
  /** NOT NULL. */
  notNull: boolean;
  /** Filled by PostgreSQL when an INSERT leaves it out: a default, an identity, a generated column. */
  filled: boolean;
}

/**
 * What is wrong with the columns of an existing records table, or undefined when each has the type
 * the store needs and none the store leaves empty is NOT NULL. `lease_until` and `status_message`
 * may be missing: migrate() adds them.
 */
function columnProblem(table: string, found: ReadonlyMap<string, FoundColumn>): string | undefined {
  for (const [column, actual] of found) {
    if (!actual.notNull || alwaysWritten.has(column)) continue;
    if (column in columnTypes) {
      return `migrate(): table ${table} exists but its column ${column} is NOT NULL, and the store leaves it NULL (a claim in progress has none); it was not made by migrate() or schema.sql: drop the constraint (ALTER COLUMN ${column} DROP NOT NULL)`;
    }
    if (!actual.filled) {
      return `migrate(): table ${table} exists but its column ${column} is NOT NULL without a default, and the store never writes it, so every claim would fail: give it a default, drop the constraint, or name another table`;
    }
  }
  for (const [column, expected] of Object.entries(columnTypes)) {
    const actual = found.get(column);
    if (actual === undefined) {
      if (addedLater.has(column)) continue;
      return `migrate(): table ${table} exists but has no column ${column}, which the store reads and writes; it was not made by migrate() or schema.sql: name another table`;
    }
    const length = /^character varying\((\d+)\)$/.exec(actual.display)?.[1];
    if (length !== undefined && column === 'status_message') {
      return `migrate(): table ${table} exists but its column status_message is ${actual.display}, which would refuse a longer reason phrase: make it text`;
    }
    if (length !== undefined && Number(length) < minVarcharLength) {
      return `migrate(): table ${table} exists but its column ${column} is ${actual.display}, shorter than the store writes there: make it text, or varchar of at least ${minVarcharLength}`;
    }
    if (!expected.includes(actual.type)) {
      return `migrate(): table ${table} exists but its column ${column} is ${actual.display}, not ${expected[0]} as the store needs (see schema.sql); it was not made by migrate() or schema.sql: change the column's type, or name another table`;
    }
  }
  return undefined;
}

/**
 * The DDL of the records table, one statement per entry. `schema.sql` in this package is exactly
 * these statements for the default table name, for teams that run migrations with their own tool.
 *
 * Why these columns: `expires_at` is when the record goes (its lease and the keep after it while in
 * progress, its retention once completed), and `lease_until` when the lease of a record in progress
 * ends (NULL for a claim kept no longer than its lease, and once completed): between the two the
 * record is abandoned. Both are always computed by the database. `body` is bytea so replays are byte
 * for byte; `headers` is jsonb; `status_message` is the handler's own reason phrase (`201 Created
 * Fine`), NULL for the status's default one; the index on `expires_at` keeps
 * {@link PostgresStore.purgeExpired} bounded. The last two statements add `lease_until` and
 * `status_message` to a table made before they existed (no-ops else): nullable columns without a
 * default, a change of the catalog only.
 *
 * @example
 * for (const statement of schemaStatements('app.idem_records')) await pool.query(statement);
 */
export function schemaStatements(table: string = defaultTable): string[] {
  const name = parseTableName(table);
  return [
    `CREATE TABLE IF NOT EXISTS ${name.sql} (
  id             text        PRIMARY KEY,
  state          text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
  token          text        NOT NULL,
  fingerprint    text        NOT NULL,
  status         integer,
  headers        jsonb,
  body           bytea,
  expires_at     timestamptz NOT NULL,
  lease_until    timestamptz,
  status_message text
)`,
    `CREATE INDEX IF NOT EXISTS "${expiresAtIndex(name)}" ON ${name.sql} (expires_at)`,
    `ALTER TABLE ${name.sql} ADD COLUMN IF NOT EXISTS lease_until timestamptz`,
    `ALTER TABLE ${name.sql} ADD COLUMN IF NOT EXISTS status_message text`,
  ];
}

/**
 * The contents of `schema.sql` for `table`: {@link schemaStatements} as one script.
 *
 * @example
 * await fs.writeFile('migrations/001_idem.sql', schemaSql('idem_records'));
 */
export function schemaSql(table: string = defaultTable): string {
  return `-- idem: idempotency records for @idem/postgres (PostgreSQL 13+ or PGlite).
-- Generated by schemaSql(); migrate() runs the same statements.
${schemaStatements(table)
  .map((statement) => `${statement};\n`)
  .join('')}`;
}

/**
 * Options of {@link migrate}.
 *
 * @example
 * await migrate(pool, { table: 'billing.idem_records' } satisfies MigrateOptions);
 */
export interface MigrateOptions {
  /** Table name, `name` or `schema.name`. Default `idem_records`. */
  table?: string | undefined;
  /**
   * How long one try of a change to an existing table (adding `lease_until` or `status_message`, building a missing index)
   * waits for the table's lock. Such a change waits for every transaction open on the table, and
   * every replay, 409 and claim of every instance queues behind it while it waits: a try that waits
   * longer gives up (`lock_timeout`), frees the queue, and is tried again after a pause. Default
   * `'500ms'`; `false` waits as long as it takes (or as your session's own `lock_timeout` says).
   */
  lockTimeout?: Duration | false | undefined;
  /**
   * How long migrate() keeps trying before it rejects with a `StoreUnavailableError` (its `cause` has
   * the code `55P03`), having changed nothing. Default `'30s'`.
   */
  lockWait?: Duration | undefined;
}

/**
 * Creates the records table and its index if they do not exist, and adds the `lease_until` and
 * `status_message` columns to a table made before them. Safe to run on every deploy and from many processes at once: it takes a
 * transaction-scoped advisory lock so concurrent runs queue instead of racing on the catalog. When
 * all is there it runs no DDL at all, so a role that may only read and write the table can call it
 * too. The store itself never runs DDL. A table of that name that the store could not use (no unique
 * key on `id`, a column missing or of another type, a NOT NULL column the store leaves empty) is refused
 * with an error that names what is wrong.
 *
 * @example
 * import pg from 'pg';
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 * await migrate(pool, { table: 'idem_records' });
 * const store = postgresStore({ client: pool, table: 'idem_records' });
 */
export async function migrate(client: PostgresClient, options: MigrateOptions = {}): Promise<void> {
  const table = parseTableName(options.table ?? defaultTable);
  const lockTimeoutMs =
    options.lockTimeout === false ? undefined : toMilliseconds(options.lockTimeout ?? '500ms', 'lockTimeout');
  const lockWaitMs = toMilliseconds(options.lockWait ?? '30s', 'lockWait');
  try {
    await retryWithPauses(() => migrateOnce(client, table, lockTimeoutMs), {
      retryable: (error) => lockTimeoutMs !== undefined && isLockTimeout(error),
      budgetMs: lockWaitMs,
    });
  } catch (error) {
    if (lockTimeoutMs === undefined || !isLockTimeout(error)) throw error;
    throw new StoreUnavailableError(
      `migrate(): the lock on ${table.name} was not free in ${lockWaitMs} ms (a transaction stays open on it: a running handler, or an idle session); nothing was changed, run migrate() again`,
      { cause: (error as { cause?: unknown }).cause ?? error },
    );
  }
}

// lock_timeout's SQLSTATE, on the error itself or on the StoreUnavailableError the client wraps it in.
const isLockTimeout = (error: unknown): boolean => {
  const code = (error as { code?: unknown })?.code;
  const causeCode = (error as { cause?: { code?: unknown } })?.cause?.code;
  return code === '55P03' || causeCode === '55P03';
};

async function migrateOnce(client: PostgresClient, table: TableName, lockTimeoutMs: number | undefined): Promise<void> {
  const [createTable, createIndex, addLeaseUntil, addStatusMessage] = schemaStatements(table.name) as [
    string,
    string,
    string,
    string,
  ];
  // Its catalog reads (booleans) must not go through parsers the application set for pg as a whole.
  const sql = createSqlClient(client, { preparedStatements: false, storeTypesInTransactions: true });
  await sql.transaction(async (tx) => {
    // One lock for every idem migration of the database, not one per name as given: `idem_records`
    // and `public.idem_records` are one table, and two CREATE TABLEs of it racing under two locks
    // would fail on the catalog's unique index (23505).
    await tx.query('SELECT pg_advisory_xact_lock(hashtext($1))', ['idem.migrate']);
    // CREATE ... IF NOT EXISTS checks privileges before existence: it needs CREATE on the schema and
    // ownership of the table even when there is nothing to do. So look first, and run only the DDL
    // that is missing. Any plain, valid b-tree index on expires_at will do, whatever its name: one
    // made under an older naming, or by a DBA, must not be built a second time (a build blocks the
    // table's writes). A hash index, or one a failed CONCURRENTLY build left invalid, serves no purge.
    const { rows } = await tx.query<{
      has_table: boolean;
      has_index: boolean;
      has_lease_until: boolean;
      has_status_message: boolean;
      has_key: boolean;
      read_only: boolean;
    }>(
      `SELECT to_regclass($1) IS NOT NULL AS has_table,
       current_setting('transaction_read_only') = 'on' AS read_only,
       EXISTS (SELECT 1 FROM pg_index x
               JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
               JOIN pg_class c ON c.oid = x.indexrelid
               JOIN pg_am m ON m.oid = c.relam
               WHERE x.indrelid = to_regclass($1) AND x.indnatts = 1 AND a.attname = 'expires_at'
                 AND x.indpred IS NULL AND x.indexprs IS NULL AND x.indisvalid AND m.amname = 'btree') AS has_index,
       EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass($1) AND attname = 'lease_until' AND NOT attisdropped) AS has_lease_until,
       EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass($1) AND attname = 'status_message' AND NOT attisdropped) AS has_status_message,
       EXISTS (SELECT 1 FROM pg_index x
               JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
               WHERE x.indrelid = to_regclass($1) AND x.indisunique AND x.indimmediate AND x.indnkeyatts = 1
                 AND a.attname = 'id' AND x.indpred IS NULL AND x.indexprs IS NULL AND x.indisvalid) AS has_key`,
      [table.sql],
    );
    // With everything there, a session that may not write (a replica, default_transaction_read_only,
    // a read-only role's setting) would pass here and fail every request with a 503: say it now.
    if (rows[0]?.read_only === true) {
      throw new Error(
        'migrate(): this database session is read-only (a standby, or default_transaction_read_only); ' +
          'the store writes a row per request: connect it to the primary, with a role that may write',
      );
    }
    // A table of that name made by something else: without a unique key on id alone (immediate, not
    // partial), every claim fails (ON CONFLICT (id) has no arbiter, 42P10) and every request is a
    // 503. Say it now rather than report the table ready.
    if (rows[0]?.has_table === true && rows[0]?.has_key !== true) {
      throw new Error(
        `migrate(): table ${table.name} exists but has no unique key on id alone, which every claim needs ` +
          '(ON CONFLICT (id)); it was not made by migrate() or schema.sql: add PRIMARY KEY (id), or name another table',
      );
    }
    // A table of that name whose columns are missing or of other types would pass every check above
    // and fail at run time, or worse, replay other bytes than it stored: say which column, now.
    if (rows[0]?.has_table === true) {
      const { rows: columns } = await tx.query<{ name: string } & FoundColumn>(
        `SELECT attname::text AS name, atttypid::regtype::text AS type, format_type(atttypid, atttypmod) AS display,
                attnotnull AS "notNull", (atthasdef OR attidentity <> '' OR attgenerated <> '') AS filled
         FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`,
        [table.sql],
      );
      const problem = columnProblem(table.name, new Map(columns.map(({ name, ...column }) => [name, column])));
      if (problem !== undefined) throw new Error(problem);
    }
    if (rows[0]?.has_table !== true) await tx.query(createTable);
    // A change to a table that exists waits for its open transactions while every request queues
    // behind it: a short wait per try (after the advisory lock, which may wait for another migrate()).
    const changesExisting =
      rows[0]?.has_table === true &&
      (rows[0]?.has_index !== true || rows[0]?.has_lease_until !== true || rows[0]?.has_status_message !== true);
    if (changesExisting && lockTimeoutMs !== undefined) {
      await tx.query(`SET LOCAL lock_timeout = '${Math.max(1, Math.round(lockTimeoutMs))}ms'`);
    }
    if (rows[0]?.has_index !== true) await tx.query(createIndex);
    // A table made by a version before abandoned records: a nullable column without a default is a
    // change of the catalog only, no rewrite of the table (its ACCESS EXCLUSIVE lock is brief).
    if (rows[0]?.has_table === true && rows[0]?.has_lease_until !== true) await tx.query(addLeaseUntil);
    // The same for a table made before reason phrases were kept. Instances already serving from it
    // without the column (this version's included, see status-message-column.ts) are unaffected.
    if (rows[0]?.has_table === true && rows[0]?.has_status_message !== true) await tx.query(addStatusMessage);
    return { commit: true, value: undefined };
  });
}
