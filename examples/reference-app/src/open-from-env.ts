import { type Database, DataDirError, openDatabase } from './db.js';
import { ConfigError } from './env.js';

/**
 * Opens the database the environment names, as `npm start`, `npm run seed` and `npm run rotate` all
 * do: PostgreSQL with DATABASE_URL, else PGlite in DATA_DIR (or the default folder). A mistake in
 * either variable is a ConfigError, one line naming it; other failures keep their stack.
 *
 * @example
 * const db = await openDatabaseFromEnv(process.env);
 */
export async function openDatabaseFromEnv(env: NodeJS.ProcessEnv): Promise<Database> {
  try {
    return await openDatabase({ url: env.DATABASE_URL, ...(env.DATA_DIR ? { dataDir: env.DATA_DIR } : {}) });
  } catch (error) {
    if (error instanceof DataDirError) throw new ConfigError(`DATA_DIR: ${error.message}`);
    const code = (error as { code?: unknown }).code;
    // pg parses the URL with WHATWG's parser: a password with `/` or `#` must be percent-encoded.
    // The URL itself is not printed (it holds the password).
    if (env.DATABASE_URL && code === 'ERR_INVALID_URL') {
      throw new ConfigError(
        'DATABASE_URL is not a valid URL (percent-encode any of : / @ # ? in the user or password)',
      );
    }
    if (env.DATABASE_URL && typeof code === 'string' && unreachableDatabase.has(code)) {
      throw new ConfigError(
        `DATABASE_URL: cannot connect to ${databaseTarget(env.DATABASE_URL)} (${(error as Error).message})`,
      );
    }
    throw error;
  }
}

// Errors that say the server named by DATABASE_URL cannot be reached or will not let us in: a
// configuration mistake. Others (a failed migration, say) keep their stack.
const unreachableDatabase = new Set([
  'ENOTFOUND',
  'EAI_AGAIN',
  'ECONNREFUSED',
  'ETIMEDOUT',
  'ECONNRESET',
  'EHOSTUNREACH',
  '28P01', // password authentication failed
  '28000', // no such role, or not allowed
  '3D000', // no such database
]);

// Where a DATABASE_URL points: host, port and database, never a user or a password (the query may
// carry one too).
function databaseTarget(url: string): string {
  try {
    const parsed = new URL(url);
    return `${parsed.hostname || 'localhost'}:${parsed.port || 5432}${parsed.pathname}`;
  } catch {
    return 'the server it names';
  }
}
