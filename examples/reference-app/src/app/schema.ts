import { type Database, onlyIfMissing, schemaLock } from '../db.js';
import { sha256IdSql } from '../sha256-id.js';

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
    -- A signed-in session's last request, for its idle limit (sessions.ts). NULL in a row an earlier
    -- version wrote: its last change stands for it.
    ${onlyIfMissing({ relation: 'app_sessions', column: 'last_seen' }, 'alter table app_sessions add column if not exists last_seen timestamptz')}
    -- A refresh of the session's tokens under way in some app process (its claim, and when the claim
    -- ends), so that processes sharing the session refresh one at a time (sessions.ts, claimRefresh).
    ${onlyIfMissing({ relation: 'app_sessions', column: 'refreshing_until' }, 'alter table app_sessions add column if not exists refreshing_until timestamptz')}
    ${onlyIfMissing({ relation: 'app_sessions', column: 'refreshing_by' }, 'alter table app_sessions add column if not exists refreshing_by text')}
    -- Each new session deletes a batch of expired ones, oldest first.
    ${onlyIfMissing({ relation: 'app_sessions_expires_at' }, 'create index if not exists app_sessions_expires_at on app_sessions (expires_at)')}
    ${hashPendingStates}
  `);
}

/**
 * Sign-ins in progress an earlier version stored with their `state` as it is get it as `stateHash`
 * (sessions.ts), in their order, so their callbacks still find them. A sign-in lives 15 minutes, so
 * there are few; the statement is idempotent (it picks only entries that still have a `state`), so it
 * runs at every start instead of once under a recorded name: a row an earlier version's process
 * writes after one start is rewritten by the next (its callback fails until then: sign in again).
 */
const hashPendingStates = `
    update app_sessions s set data = jsonb_set(s.data, '{pending}', (
      select jsonb_agg(case
        when entry ? 'state' then (entry - 'state') || jsonb_build_object('stateHash', ${sha256IdSql("entry ->> 'state'")})
        else entry
      end order by n)
      from jsonb_array_elements(s.data -> 'pending') with ordinality as t(entry, n)
    ))
    where jsonb_typeof(s.data -> 'pending') = 'array' and jsonb_path_exists(s.data, '$.pending[*] ? (exists(@.state))');`;
