import { migrate } from '@idem/postgres';
import { createOutbox, generateSecret } from '@idem/webhooks';
import { type Database, onlyIfMissing, schemaLock } from '../db.js';

/** Table names of the API, the gateway-facing resources and the webhook receiver, in one place. */
export const apiTables = {
  /** Idempotency records of `POST /charges` (transactional mode). */
  idempotency: 'api_idempotency_records',
  /** Idempotency records of the routes that are not transactional (`POST /photos`), when Redis is not configured. */
  plainIdempotency: 'api_plain_idempotency_records',
  /** The `payment.succeeded` outbox the API's relay delivers from. */
  outbox: 'api_webhook_outbox',
  /** Event ids the receiver has seen (its inbox), on the same engine as the API's keys. */
  receiverInbox: 'receiver_inbox_records',
} as const;

const ddl = `
  ${schemaLock}
  create table if not exists api_charges (
    id text primary key,
    owner text not null,
    amount integer not null check (amount > 0),
    currency text not null,
    idempotency_key text not null,
    created_at timestamptz not null default now()
  );
  create table if not exists api_photos (
    id text primary key,
    owner text not null,
    title text not null,
    url text not null,
    created_at timestamptz not null default now(),
    deleted_at timestamptz
  );
  ${onlyIfMissing({ relation: 'api_photos_owner' }, 'create index if not exists api_photos_owner on api_photos (owner) where deleted_at is null')}
  create table if not exists api_stock (
    item text primary key,
    name text not null,
    level integer not null check (level >= 0),
    updated_at timestamptz not null default now()
  );
  create table if not exists api_settings (
    owner text primary key,
    theme text not null,
    updated_at timestamptz not null default now()
  );
  create table if not exists api_webhook_secrets (
    name text primary key,
    secret text not null
  );
  create table if not exists receiver_event_notes (
    id bigserial primary key,
    event_id text not null,
    author text not null,
    text text not null,
    created_at timestamptz not null default now(),
    request_key text
  );
  -- The request a note was added by (see addEventNote): a run after a crash finds the note instead of
  -- adding a second. Added to a table made before it; a nullable column without a default rewrites no row.
  ${onlyIfMissing({ relation: 'receiver_event_notes', column: 'request_key' }, 'alter table receiver_event_notes add column if not exists request_key text')}
  ${onlyIfMissing({ relation: 'receiver_event_notes_request_key' }, 'create unique index if not exists receiver_event_notes_request_key on receiver_event_notes (request_key)')}
  create table if not exists receiver_events (
    id text primary key,
    type text,
    charge_id text,
    amount integer,
    currency text,
    deliveries integer not null default 0,
    applied integer not null default 0,
    first_delivery_at timestamptz not null default now(),
    last_delivery_at timestamptz not null default now(),
    applied_at timestamptz
  );
  create table if not exists receiver_charges (
    charge_id text primary key,
    status text not null,
    version bigint not null,
    event_id text not null,
    updated_at timestamptz not null default now()
  );
`;

/**
 * Creates the tables of the API and the webhook receiver (charges, photos, stock, settings, the
 * webhook secret, the receiver's event list), the two idempotency record tables and the outbox.
 * Safe to run on every start.
 *
 * @example
 * ```ts
 * const db = await openDatabase({ memory: true });
 * await migrateApi(db);
 * ```
 */
export async function migrateApi(db: Database): Promise<void> {
  await db.exec(ddl);
  await migrate(db.client, { table: apiTables.idempotency });
  await migrate(db.client, { table: apiTables.plainIdempotency });
  await migrate(db.client, { table: apiTables.receiverInbox });
  // The outbox migration is several statements in one string, which PGlite only runs through exec.
  await createOutbox({ table: apiTables.outbox }).migrate({
    async query(text: string) {
      await db.exec(text);
      return { rows: [], rowCount: 0 };
    },
  });
}

/**
 * The Standard Webhooks secret shared by the API's sender and the receiver: generated once, kept in
 * the database, so events still waiting in the outbox after a restart verify at the receiver.
 *
 * @example
 * ```ts
 * const secret = await loadWebhookSecret(db); // 'whsec_...'
 * ```
 */
export async function loadWebhookSecret(db: Database): Promise<string> {
  const fresh = generateSecret('v1') as { secret: string };
  await db.query('insert into api_webhook_secrets (name, secret) values ($1, $2) on conflict (name) do nothing', [
    'payments',
    fresh.secret,
  ]);
  const { rows } = await db.query<{ secret: string }>('select secret from api_webhook_secrets where name = $1', [
    'payments',
  ]);
  const row = rows[0];
  if (!row) throw new Error('the webhook secret could not be stored');
  return row.secret;
}
