import { type Database, onlyIfMissing, schemaLock } from '../db.js';

/**
 * Creates the identity provider's tables if they are missing. Safe to run on every start.
 *
 * - `idp_users`: accounts, passwords only as argon2id hashes;
 * - `idp_clients`: registered OAuth clients (metadata as oidc-provider reads it);
 * - `idp_secrets`: the signing keys and cookie keys, generated once, never in the repository;
 * - `idp_models`: everything oidc-provider stores through its adapter (sessions, grants, codes, tokens);
 *   a refresh token's row also says which token it was rotated from and when its one reuse happened
 *   (`rotated_from`, `reused_at`: the reuse interval in `adapter.ts`), added to an older table here.
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
    ${onlyIfMissing({ relation: 'idp_models', column: 'rotated_from' }, 'alter table idp_models add column if not exists rotated_from text')}
    ${onlyIfMissing({ relation: 'idp_models', column: 'reused_at' }, 'alter table idp_models add column if not exists reused_at timestamptz')}
    ${onlyIfMissing({ relation: 'idp_models_grant_id' }, 'create index if not exists idp_models_grant_id on idp_models (grant_id) where grant_id is not null')}
    ${onlyIfMissing({ relation: 'idp_models_uid' }, 'create index if not exists idp_models_uid on idp_models (model, uid) where uid is not null')}
    ${onlyIfMissing({ relation: 'idp_models_user_code' }, 'create index if not exists idp_models_user_code on idp_models (model, user_code) where user_code is not null')}
    ${onlyIfMissing({ relation: 'idp_models_expires_at' }, 'create index if not exists idp_models_expires_at on idp_models (expires_at) where expires_at is not null')}
  `);
}
