import { type Database, onlyIfMissing, schemaLock } from '../db.js';
import { sha256IdSql } from '../sha256-id.js';
import { idsKeptAsGiven } from './stored-id.js';

/**
 * Creates the identity provider's tables if they are missing. Safe to run on every start.
 *
 * - `idp_users`: accounts, passwords only as argon2id hashes;
 * - `idp_clients`: registered OAuth clients (metadata as oidc-provider reads it);
 * - `idp_secrets`: the signing keys and cookie keys, generated once, never in the repository;
 * - `idp_models`: everything oidc-provider stores through its adapter (sessions, grants, codes, tokens);
 *   a refresh token's row also says which token it was rotated from and when its one reuse happened
 *   (`rotated_from`, `reused_at`: the reuse interval in `adapter.ts`), added to an older table here;
 * - `idp_upgrades`: the upgrades of stored rows done once, by name.
 *
 * Rows an earlier version stored under the id itself (a refresh token, the session cookie...) are
 * rewritten once to the form `stored-id.ts` describes: keyed by a SHA-256 of the id, no copy of it in
 * the payload. In the script's one transaction, under its lock: two processes starting at once do it
 * once, and one killed midway leaves every row as it was, for the next start to do. Stop the processes
 * of the earlier version first: a row one of them stores after the upgrade is under its id, which this
 * version never looks up.
 *
 * @example
 * ```ts
 * await migrateIdp(db);
 * ```
 */
export async function migrateIdp(db: Database): Promise<void> {
  await db.exec(`
    ${schemaLock}
    create table if not exists idp_users (
      id text primary key,
      username text not null unique,
      password_hash text not null,
      name text not null,
      email text not null,
      roles text[] not null default '{}'
    );
    create table if not exists idp_clients (
      client_id text primary key,
      metadata jsonb not null
    );
    create table if not exists idp_secrets (
      name text primary key,
      value jsonb not null
    );
    create table if not exists idp_models (
      model text not null,
      id text not null,
      payload jsonb not null,
      grant_id text,
      uid text,
      user_code text,
      expires_at timestamptz,
      consumed_at timestamptz,
      rotated_from text,
      reused_at timestamptz,
      primary key (model, id)
    );
    create table if not exists idp_upgrades (
      name text primary key,
      done_at timestamptz not null default now()
    );
    ${onlyIfMissing({ relation: 'idp_models', column: 'rotated_from' }, 'alter table idp_models add column if not exists rotated_from text')}
    ${onlyIfMissing({ relation: 'idp_models', column: 'reused_at' }, 'alter table idp_models add column if not exists reused_at timestamptz')}
    ${onlyIfMissing({ relation: 'idp_models_grant_id' }, 'create index if not exists idp_models_grant_id on idp_models (grant_id) where grant_id is not null')}
    ${onlyIfMissing({ relation: 'idp_models_uid' }, 'create index if not exists idp_models_uid on idp_models (model, uid) where uid is not null')}
    ${onlyIfMissing({ relation: 'idp_models_user_code' }, 'create index if not exists idp_models_user_code on idp_models (model, user_code) where user_code is not null')}
    ${onlyIfMissing({ relation: 'idp_models_expires_at' }, 'create index if not exists idp_models_expires_at on idp_models (expires_at) where expires_at is not null')}
    ${hashStoredIds}
  `);
}

const kept = idsKeptAsGiven.map((model) => `'${model}'`).join(', ');

/**
 * The rewrite of rows stored under their ids (see {@link migrateIdp}), as `payloadAtRest` stores them:
 * the id and a refresh token's `rotated_from` hashed, `jti` dropped, and an Interaction's copies of the
 * session cookie and of its own id (`session.cookie`, the end of `returnTo`) gone. On a new table it
 * finds nothing to rewrite and is only recorded as done.
 */
const hashStoredIds = `do $$ begin
  if not exists (select 1 from idp_upgrades where name = 'ids hashed') then
    update idp_models m set
      id = ${sha256IdSql('m.id')},
      rotated_from = ${sha256IdSql('m.rotated_from')},
      payload = case
        when m.model = 'Interaction' then
          ((m.payload - 'jti') #- '{session,cookie}') || case
            when right(m.payload ->> 'returnTo', length(m.id) + 1) = '/' || m.id
              then jsonb_build_object('returnTo', left(m.payload ->> 'returnTo', -length(m.id)))
            else '{}'::jsonb
          end
        else m.payload - 'jti'
      end
    where m.model not in (${kept});
    insert into idp_upgrades (name) values ('ids hashed');
  end if;
end $$;`;
