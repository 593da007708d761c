import { constants } from 'node:fs';
import { access, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { resolve } from 'node:path';
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

/**
 * DDL that runs only when the catalog says it is missing: `create index if not exists` and `alter
 * table ... add column if not exists` take their table's lock before they look, so on every start
 * they would wait for each transaction open on the table (a charge, a login) while every statement
 * on it queued behind them. `relation` is the index (or, with `column`, the table) that the DDL
 * makes; it is looked up on the search path, as the DDL itself is.
 *
 * @example
 * ```ts
 * onlyIfMissing({ relation: 'app_sessions_expires_at' }, 'create index if not exists app_sessions_expires_at on app_sessions (expires_at)');
 * ```
 */
export function onlyIfMissing(what: { relation: string; column?: string }, ddl: string): string {
  const missing =
    what.column === undefined
      ? `to_regclass('${what.relation}') is null`
      : `not exists (select 1 from pg_attribute where attrelid = to_regclass('${what.relation}') and attname = '${what.column}' and not attisdropped)`;
  return `do $$ begin if ${missing} then ${ddl}; end if; end $$;`;
}

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

/**
 * The embedded database's folder cannot be used: it is no folder, this user may not write it, or
 * another process has it open. `npm start` prints it as one line naming DATA_DIR.
 */
export class DataDirError extends Error {
  override readonly name = 'DataDirError';
}

/**
 * Takes the folder for this process. PGlite takes no lock of its own: two processes on one folder
 * each keep their own buffers, the last to close writes its view over the other's, and charges
 * answered 201 vanish with their Idempotency-Key records (a retry then charges again). The lock
 * (`<folder>.lock`) holds the owner's pid; a lock whose process is gone (killed, crashed) is taken over.
 */
async function lockFolder(dataDir: string): Promise<() => Promise<void>> {
  try {
    await mkdir(dataDir, { recursive: true });
  } catch (error) {
    throw folderError(dataDir, error);
  }
  try {
    await access(dataDir, constants.R_OK | constants.W_OK | constants.X_OK);
  } catch (error) {
    throw folderError(dataDir, error);
  }
  // Beside the folder, not in it: PGlite refuses to create a database in a folder that holds a file.
  const path = `${resolve(dataDir)}.lock`;
  const mine = String(process.pid);
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      await writeFile(path, mine, { flag: 'wx' });
      return async () => {
        // Removed only if still ours: never another process's lock taken over after ours went stale.
        if ((await readFile(path, 'utf8').catch(() => '')) === mine) await rm(path, { force: true });
      };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw folderError(dataDir, error);
    }
    const owner = Number((await readFile(path, 'utf8').catch(() => '')).trim());
    if (Number.isSafeInteger(owner) && owner > 0 && alive(owner)) {
      throw new DataDirError(
        `${dataDir} is in use by process ${owner} (another npm start?); stop it, or set DATA_DIR to another folder`,
      );
    }
    await rm(path, { force: true });
  }
  throw new DataDirError(`${dataDir} is being taken by another process at the same moment; try again`);
}

// A signal 0 tests for the process without touching it; EPERM means it exists under another user.
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function folderError(dataDir: string, error: unknown): unknown {
  const code = (error as NodeJS.ErrnoException).code;
  if (code === 'EEXIST' || code === 'ENOTDIR') return new DataDirError(`${dataDir} is not a folder`);
  if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') {
    return new DataDirError(`cannot write ${dataDir} (${code}); set DATA_DIR to a writable folder, or DATABASE_URL`);
  }
  return error;
}

async function openPglite(dataDir: string | undefined): Promise<Database> {
  const unlock = dataDir === undefined ? async () => {} : await lockFolder(dataDir);
  let client: PGlite;
  try {
    client = dataDir === undefined ? new PGlite() : new PGlite(dataDir);
    await client.waitReady;
  } catch (error) {
    await unlock();
    // PGlite's failed starts say neither where nor why, and differ by version: an ExitStatus
    // ("Program terminated with exit(1)") in 0.3, an ErrnoError or "failed to initialize properly" in
    // 0.5. Files it may not read (a folder left by another user) or a folder made by another
    // PostgreSQL major are the usual causes.
    if (dataDir === undefined) throw error;
    throw new DataDirError(
      `cannot open the database in ${dataDir} (check the owner and modes of its files, or that this PGlite made it); set DATA_DIR to another folder, or DATABASE_URL`,
      { cause: error },
    );
  }
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
      try {
        await client.close();
      } finally {
        await unlock();
      }
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
