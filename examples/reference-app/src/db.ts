import { mkdir } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';

/** Rows and the number of rows a statement touched: one shape for PGlite and `pg`. */
export interface QueryResult<Row> {
  rows: Row[];
  rowCount: number;
}

/**
 * The one database handle every component of the reference app shares.
 *
 * @example
 * ```ts
 * const db = await openDatabase({ memory: true });
 * const { rows } = await db.query<{ one: number }>('select 1 as one');
 * await db.close();
 * ```
 */
export interface Database {
  /** `pglite` for the embedded default, `postgres` when `DATABASE_URL` (or `url`) is set. */
  readonly kind: 'pglite' | 'postgres';
  /** The driver object, for libraries that take a client themselves (for example `@idem/postgres`). */
  readonly client: PGlite | pg.Pool;
  /** One statement with positional parameters (`$1`, `$2`, ...). */
  query<Row = Record<string, unknown>>(text: string, params?: readonly unknown[]): Promise<QueryResult<Row>>;
  /** Several statements without parameters, for schema set-up. */
  exec(sql: string): Promise<void>;
  /** Closes the handle; the database owns its driver, so this ends the pool or the PGlite instance. */
  close(): Promise<void>;
}

/** Where {@link openDatabase} connects. */
export interface DatabaseOptions {
  /** A PostgreSQL URL; wins over everything else. */
  url?: string | undefined;
  /** Keep PGlite in memory (tests); otherwise PGlite lives in `dataDir`. */
  memory?: boolean;
  /** PGlite's folder; default `examples/reference-app/data/` (git-ignored). */
  dataDir?: string;
  /**
   * PostgreSQL only: a schema created on connect and put first on every connection's `search_path`,
   * so parallel test files (or several demos on one server) never see each other's tables.
   */
  schema?: string;
}

/**
 * The first statement of every start-up schema script: a transaction-scoped advisory lock, so two
 * processes starting at once on an empty database run their `create ... if not exists` one after
 * the other (together, the second fails with 23505 on `pg_type`). A script of several statements
 * sent through `exec` is one implicit transaction, which holds the lock to its end.
 */
export const schemaLock = `select pg_advisory_xact_lock(hashtext('idem reference app schema'));`;

/** The git-ignored folder the embedded database lives in when nothing else is configured. */
export const defaultDataDir = fileURLToPath(new URL('../data/pglite', import.meta.url));

const schemaName = /^[a-z_][a-z0-9_]{0,62}$/;

/**
 * Opens the shared database: PostgreSQL when a URL is given, PGlite otherwise.
 *
 * @example
 * ```ts
 * const db = await openDatabase({ url: process.env.DATABASE_URL });
 * await db.query('create table if not exists notes (id text primary key)');
 * ```
 */
export async function openDatabase(options: DatabaseOptions = {}): Promise<Database> {
  if (options.schema !== undefined && !schemaName.test(options.schema)) {
    throw new TypeError('openDatabase: schema must be a lower-case SQL identifier');
  }
  if (options.url) return openPostgres(options.url, options.schema);
  return openPglite(options.memory ? undefined : (options.dataDir ?? defaultDataDir));
}

async function openPglite(dataDir: string | undefined): Promise<Database> {
  if (dataDir !== undefined) await mkdir(dataDir, { recursive: true });
  const client = dataDir === undefined ? new PGlite() : new PGlite(dataDir);
  await client.waitReady;
  return {
    kind: 'pglite',
    client,
    async query<Row>(text: string, params: readonly unknown[] = []) {
      const result = await client.query<Row>(text, [...params]);
      return { rows: result.rows, rowCount: result.affectedRows ?? result.rows.length };
    },
    async exec(sql: string) {
      await client.exec(sql);
    },
    async close() {
      await client.close();
    },
  };
}

async function openPostgres(url: string, schema: string | undefined): Promise<Database> {
  const pool = new pg.Pool({
    connectionString: url,
    max: 5,
    ...(schema === undefined ? {} : { options: `-c search_path=${schema},public` }),
  });
  // An idle client dropped by the server emits 'error' on the pool; without a listener that kills the process.
  pool.on('error', () => {});
  try {
    // Connected once here, so a wrong URL fails the open, not whatever first asks for a row.
    await pool.query(schema === undefined ? 'select 1' : `create schema if not exists ${schema}`);
  } catch (error) {
    await pool.end().catch(() => {});
    throw error;
  }
  return {
    kind: 'postgres',
    client: pool,
    async query<Row>(text: string, params: readonly unknown[] = []) {
      const result = await pool.query(text, [...params]);
      return { rows: result.rows as Row[], rowCount: result.rowCount ?? 0 };
    },
    async exec(sql: string) {
      await pool.query(sql);
    },
    async close() {
      await pool.end();
    },
  };
}
