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
      created_at timestamptz not null default now(),
      expires_at timestamptz not null
    );
    -- A session's lifetime counts from here (sessions.ts). A table made before the column gets it with
    -- its rows taken as created now: they end 12 hours after the upgrade at the latest.
    ${onlyIfMissing({ relation: 'app_sessions', column: 'created_at' }, 'alter table app_sessions add column if not exists created_at timestamptz not null default now()')}
    -- Each new session deletes a batch of expired ones, oldest first.
    ${onlyIfMissing({ relation: 'app_sessions_expires_at' }, 'create index if not exists app_sessions_expires_at on app_sessions (expires_at)')}
  `);
}
