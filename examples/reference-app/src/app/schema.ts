import { type Database, onlyIfMissing, schemaLock } from '../db.js';

/**
 * Creates the third-party app's session table. Sessions live server-side: the browser holds only a
 * random id, and the table stores its SHA-256, so a leaked table row cannot be replayed as a cookie.
 *
 * @example
 * ```ts
 * await migrateApp(db);
 * ```
 */
export async function migrateApp(db: Database): Promise<void> {
  await db.exec(`
    ${schemaLock}
    create table if not exists app_sessions (
      id_hash text primary key,
      data jsonb not null,
      expires_at timestamptz not null
    );
    -- Each new session deletes a batch of expired ones, oldest first.
    ${onlyIfMissing({ relation: 'app_sessions_expires_at' }, 'create index if not exists app_sessions_expires_at on app_sessions (expires_at)')}
  `);
}
