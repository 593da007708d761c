import { createHash, randomUUID } from 'node:crypto';
import { maxTimerMs } from '@idem/client';
import {
  assertKnownOptions,
  type Duration,
  type ListsEvery,
  notify,
  retryWithPauses,
  toMilliseconds,
  withoutCommandValues,
} from '@idem/core';
import { toBodyBytes, type WebhookBody } from './body.js';
import { contentTypeAsCompared } from './content-type-compare.js';
import { assertDeliverable, headersNotSentAsGiven } from './deliverable.js';
import { WebhookError } from './errors.js';
import { decodeCursor, encodeCursor } from './outbox-cursor.js';
import { runSlots } from './relay-slots.js';
import type { AttemptRecord, Sender } from './sender.js';

/**
 * Anything that runs a parameterised query the way `pg` does: a `Pool`, a `Client`, or the client of
 * an open transaction. The outbox never opens, closes or releases connections.
 */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
}

/** Options of {@link createOutbox}. */
export interface OutboxOptions {
  /** Table name, optionally schema-qualified. Default `idem_webhook_outbox`. */
  table?: string | undefined;
}

/** An event to deliver, as the business transaction records it. */
export interface OutboxEvent {
  /** The event id (`webhook-id`). Default: a fresh `evt_<uuid>`. */
  id?: string | undefined;
  /**
   * The endpoint. Stored as its href, as fetch parses it (host lower-cased, default port dropped), so
   * that two spellings of one endpoint are one event to `add()` and one URL to the relay.
   */
  url: string | URL;
  /** The exact bytes to send; an object is sent as its JSON. */
  body: WebhookBody | Record<string, unknown>;
  /** Default `application/json`. */
  contentType?: string | undefined;
  /**
   * Extra headers for this event. Names are case-insensitive (sent lower-cased, compared so by
   * `add()`), and one name in two spellings (`X-A` and `x-a`) is refused with a `TypeError`. Values
   * go out (and compare) trimmed; `content-length` (counted from the body), `content-type` (see
   * `contentType`) and the signer's three `webhook-*` headers are a `TypeError`.
   */
  headers?: Record<string, string> | undefined;
}

/**
 * A history entry for a claim whose relay died (or stalled past its lease) before it recorded a
 * result: the attempt it counted in `attempts` was lost, and whether it reached the endpoint is
 * unknown. The claim that takes the row over appends it in the statement that does (so does a 410
 * for another event of the URL that dead-letters the row first), so `history` has one entry per
 * attempt counted, in order (`attempt` is 1, 2, ... since the event was added or last requeued).
 * Told apart from an {@link AttemptRecord} by `result`. Times are epoch ms on the database clock:
 * the row does not keep when the lost claim was made.
 */
export interface LostAttempt {
  /** The number the lost claim counted. */
  attempt: number;
  result: 'lost';
  /** The fencing token (`claims`) the lost claim held. */
  claim: number;
  /** The relay that made the lost claim (`locked_by`). */
  relayId: string;
  /** When the lost claim's lease ran out: the claim was made one lease (of the relay that died) before. */
  leaseEndedAt: number;
  /** When the row was taken over (or dead-lettered by a 410) and the attempt found lost. */
  takenOverAt: number;
}

// How far into the due rows a relay's claim reads (`_due`, in due order) before it gives up on the
// head and walks the URLs instead: `headPerWindow` times its window of candidates (twice its limit),
// at least `headRows`. The head covers the rows a claim passes over in the common case (the other
// relays' rows in flight, a backlog of a URL at its share that is not long) so that only a long
// backlog of URLs the claim may not take brings the walk in. Measured: 1,000 rows of a dead URL's
// backlog read past cost 0.43 ms, about what the walk that follows costs (0.9 ms, its planning
// included), so a claim behind any backlog costs at most about twice the cheapest of the two.
const headRows = 1_000;
const headPerWindow = 10;
// The most URLs one walk looks at (URLs at their share stepped over are not counted): its
// window of candidates, at least `minProbes`. About 12 µs each (32: 0.4 ms, 100: 1.2 ms), so a
// claim stays bounded with any number of endpoints; the next claim goes on where it stopped.
const minProbes = 32;

// The most attempts a row's `history` keeps: the first `historyHead` (how the failures began) and
// the latest ones. `attempts` still counts them all. Without a bound, a long horizon (a schedule
// that retries for months) grows a row by up to a KiB of response per attempt, and every attempt
// rewrites the whole history.
const maxHistory = 100;
const historyHead = 10;

// SQL for `history` with `entry` (a jsonb object) appended, at the cap keeping the head and the
// latest entries. Not just the one oldest entry after the head dropped per append: a row written
// before the cap existed can hold thousands, and dropping one per append would keep it that long
// (and rewrite all of it on every attempt) for as long as the row lives.
const appended = (history: string, entry: string) =>
  `CASE WHEN jsonb_array_length(${history}) >= ${maxHistory}
        THEN (SELECT jsonb_agg(kept.item ORDER BY kept.n) FROM jsonb_array_elements(${history}) WITH ORDINALITY AS kept(item, n)
               WHERE kept.n <= ${historyHead} OR kept.n > jsonb_array_length(${history}) - ${maxHistory - historyHead - 1})
             || jsonb_build_array(${entry})
        ELSE ${history} || jsonb_build_array(${entry}) END`;

/** A row of the outbox, as {@link Outbox.deadLetters} lists it. */
export interface OutboxRow {
  id: string;
  url: string;
  status: 'pending' | 'delivered' | 'dead';
  /** Attempts since the event was added, or since its last requeue. */
  attempts: number;
  /** When the event was added. A requeue keeps it. */
  createdAt: Date;
  /** When the event was last requeued (its horizon counts from here), or null. */
  requeuedAt: Date | null;
  deadReason: string | null;
  /**
   * When the row was dead-lettered (PostgreSQL's clock), or null for a row dead-lettered before the
   * outbox kept it (by a version before `dead_at`, or by a relay of one during a rolling upgrade).
   * A requeue clears it.
   */
  deadAt: Date | null;
  /** The last attempt whose result was recorded. A {@link LostAttempt} is never it: nothing came back. */
  lastAttempt: AttemptRecord | null;
  /**
   * Every attempt, in order, the lost ones included, up to 100 entries: past that the first 10 and
   * the latest 90 (each entry's `attempt` says which it was). A requeue keeps it.
   */
  history: (AttemptRecord | LostAttempt)[];
}

/** Options of {@link Outbox.relay}. */
export interface RelayOptions {
  /** Where the relay reads and updates rows: a `pg` Pool (or any {@link Queryable}). */
  db: Queryable;
  /** Delivers and signs; its schedule (backoff, horizon, max attempts) is the outbox's schedule. */
  sender: Sender;
  /**
   * How many rows the relay works on at once: `runOnce()` claims up to this many, and the `start()`
   * loop keeps up to this many attempts in flight, claiming again as soon as one ends. Default 10.
   */
  batchSize?: number | undefined;
  /**
   * How many of those may be one URL's at once (its share): a backlog for one endpoint, a dead one
   * that makes every attempt wait out the timeout or a slow one, never takes more, and the other
   * endpoints' events go out through the rest. A positive integer up to `batchSize`; default half
   * of `batchSize` (at least 1). Counted per relay: with several relays, an endpoint may get one
   * share from each.
   */
  maxPerUrl?: number | undefined;
  /**
   * How long a claimed row stays reserved for this relay. A relay that dies mid-delivery frees its rows
   * after this. Must exceed the sender's per-attempt timeout. Default: the timeout plus 15 s.
   */
  lease?: Duration | undefined;
  /**
   * The `start()` loop's pause after a claim that found nothing more due (or failed), before it claims
   * again; a slot that frees ends it sooner. Default `'1s'`.
   */
  pollInterval?: Duration | undefined;
  /** Identifies this relay in `locked_by`. Default a random UUID. */
  relayId?: string | undefined;
  /** Called after every attempt. What it throws or rejects with is swallowed. */
  onAttempt?: ((row: { id: string; url: string }, attempt: AttemptRecord) => void) | undefined;
  /**
   * Called when a claim or a row's work in the background loop (`start()`) fails, e.g. the database is
   * down, and when a hold of a throttling URL or a 410's dead-lettering fails; the loop goes on (after
   * `pollInterval` for a claim). Without it such failures are silent. What it throws or rejects with
   * is swallowed.
   */
  onError?: ((error: unknown) => void) | undefined;
}

const relayOptionNames = [
  'db',
  'sender',
  'batchSize',
  'maxPerUrl',
  'lease',
  'pollInterval',
  'relayId',
  'onAttempt',
  'onError',
] as const satisfies readonly (keyof RelayOptions)[];
const relayOptionNamesAll: ListsEvery<RelayOptions, typeof relayOptionNames> = true;
void relayOptionNamesAll;

/** What one relay round did. */
export interface RelayRound {
  /** Rows this round claimed. */
  claimed: number;
  delivered: number;
  /**
   * Rows left pending for a later attempt: after a failed attempt, or taken over from a relay that
   * died mid-attempt and put back after a backoff wait without a new attempt.
   */
  retrying: number;
  /** Rows dead-lettered, including the other rows of a URL that answered 410. */
  dead: number;
  /**
   * Results refused because this relay's lease ran out and another claim took the row over: that
   * claim's outcome stands, and this round changed nothing for the row.
   */
  fenced: number;
}

/** One page of {@link Outbox.deadLetters}. */
export interface DeadLetterPage {
  rows: OutboxRow[];
  /** Pass as `after` for the next page; undefined on the last page. */
  next: string | undefined;
}

/** Options of {@link Outbox.deadLetters}. */
export interface DeadLetterOptions {
  /** Rows per page, a positive integer. Default 100. */
  limit?: number | undefined;
  /** The `next` of the previous page: this page starts after it. */
  after?: string | undefined;
}

const deadLetterOptionNames = ['limit', 'after'] as const satisfies readonly (keyof DeadLetterOptions)[];
const deadLetterOptionNamesAll: ListsEvery<DeadLetterOptions, typeof deadLetterOptionNames> = true;
void deadLetterOptionNamesAll;

/** Options of {@link Outbox.migrate}. */
export interface OutboxMigrateOptions {
  /**
   * How long one try of a change to a table that exists (adding a column, building a missing index)
   * waits for the table's lock. Such a change waits for every transaction open on the table (one
   * that called `add()` and is still running), and every relay claim and `add()` queues behind it
   * while it waits: a try that waits longer gives up, frees the queue, and is tried again after a
   * pause. Default `'500ms'`; `false` waits as long as it takes (or as your session's own
   * `lock_timeout` says). It does not bound the build of an index once it has its lock.
   */
  lockTimeout?: Duration | false | undefined;
  /** How long migrate() keeps trying before it rejects with the last `55P03` error. Default `'30s'`. */
  lockWait?: Duration | undefined;
}

const migrateOptionNames = ['lockTimeout', 'lockWait'] as const satisfies readonly (keyof OutboxMigrateOptions)[];
const migrateOptionNamesAll: ListsEvery<OutboxMigrateOptions, typeof migrateOptionNames> = true;
void migrateOptionNamesAll;

/** Options of {@link Outbox.purge}. */
export interface PurgeOptions {
  /**
   * Delivered rows whose `delivered_at` is older than this go (`'30d'`, or milliseconds). Required:
   * how long a producer may add the same id again is yours to say (see {@link Outbox.purge}).
   */
  olderThan: Duration;
  /**
   * Dead-lettered rows go too, once dead-lettered longer than `olderThan` ago (`dead_at`). A row
   * dead-lettered before the outbox kept `dead_at` (by an earlier version) is aged by the later of
   * `created_at`, `requeued_at` and `next_attempt_at` instead: its last write set that one to when
   * it died, or later. Default false.
   */
  dead?: boolean | undefined;
  /** Rows per DELETE statement, each its own short transaction on a pool. Default 1000. */
  batchSize?: number | undefined;
  /** Stops before the next batch once aborted; the rows deleted so far are counted. */
  signal?: AbortSignal | undefined;
}

const purgeOptionNames = [
  'olderThan',
  'dead',
  'batchSize',
  'signal',
] as const satisfies readonly (keyof PurgeOptions)[];
const purgeOptionNamesAll: ListsEvery<PurgeOptions, typeof purgeOptionNames> = true;
void purgeOptionNamesAll;

/** A relay process loop. */
export interface Relay {
  /**
   * Claims due rows (FOR UPDATE SKIP LOCKED), makes one attempt each, records the results. A row
   * whose previous claim never recorded a result (its relay died mid-attempt) gets no attempt, and its
   * body is not even read: the claim appends a {@link LostAttempt} to its history, and the row is put
   * back after a backoff wait, as after a failed attempt, or dead-lettered if that claim used up the
   * last attempt or the wait would pass the horizon. A row already at `maxAttempts`, or attempted
   * before and already past the horizon, is dead-lettered by the claim itself, unread. If a row
   * fails (the database, a custom sender), it rejects with that error, but only once every other row
   * of the round is settled. A round that outlives its lease rejects with `relay_round_timeout`
   * (what it does after that counts for nothing, and it finishes in the background).
   */
  runOnce(): Promise<RelayRound>;
  /** Starts polling in the background. */
  start(): void;
  /**
   * Stops claiming and waits for the attempts in flight, each at most until its lease ends. A hold of
   * a throttling URL (or a 410's dead-lettering) they started writes no further batch of the URL's
   * rows: the ones left are held when a claim reaches one and gets the same answer.
   */
  stop(): Promise<void>;
  readonly relayId: string;
}

/** A PostgreSQL transactional outbox for webhooks. */
export interface Outbox {
  readonly table: string;
  /**
   * Creates the table and its indexes if missing (and an index that does the same work under another
   * name counts). Safe to run from several processes at once; once all is there, it takes no lock
   * that would hold up a relay or an `add()`.
   */
  migrate(db: Queryable, options?: OutboxMigrateOptions): Promise<void>;
  /**
   * Records an event inside the caller's transaction: pass the client that ran `BEGIN`. It is sent only
   * if that transaction commits. Adding the same event (url, body bytes, content type and headers, as
   * the relay sends them: header names in any case, values trimmed, no `content-length`, `content-type`
   * or signer's `webhook-*` header, the media type and parameter names in any case, the charset's
   * value too, a parameter's value quoted or not) under an id the outbox holds is a no-op
   * (`added: false`); another event under it is refused with a
   * {@link WebhookError} `event_id_reused`, and the transaction is left as it was. An id that others
   * keep adding and deleting while add() looks at it (three times over) is `event_id_contended`:
   * nothing added, the transaction left as it was, and add() may be tried again. An event that
   * could never be sent (a URL that is not http: or https:, a header fetch refuses or the sender sets or counts
   * itself, no body) throws a
   * `TypeError` here instead of failing every attempt until the horizon.
   */
  add(tx: Queryable, event: OutboxEvent): Promise<{ id: string; added: boolean }>;
  /** Creates a relay that delivers the committed events. */
  relay(options: RelayOptions): Relay;
  /**
   * Lists dead-lettered events, oldest first (by `created_at`, then id), one page at a time: pass a
   * page's `next` as `after` to get the following one. A malformed `after` or `limit`, or an option
   * it does not know, rejects with a `TypeError`.
   *
   * @example
   * let page = await outbox.deadLetters(pool, { limit: 100 });
   * for (;;) {
   *   for (const row of page.rows) console.log(row.id, row.deadReason);
   *   if (!page.next) break;
   *   page = await outbox.deadLetters(pool, { limit: 100, after: page.next });
   * }
   */
  deadLetters(db: Queryable, options?: DeadLetterOptions): Promise<DeadLetterPage>;
  /**
   * Moves a dead-lettered event back to pending, due now, with a fresh horizon (counted from
   * `requeued_at`) and a fresh count of attempts, and clears its `dead_at`. Its `created_at` and
   * history keep the old ones.
   * True if it was dead.
   */
  requeue(db: Queryable, id: string): Promise<boolean>;
  /**
   * Deletes delivered rows whose `delivered_at` is older than `olderThan` (and, with `dead: true`,
   * dead-lettered rows whose `dead_at` is older than that), `batchSize` rows per DELETE,
   * until a batch deletes fewer, and resolves to how many it deleted. The age is measured by
   * PostgreSQL's clock (`now()`), as the relay's schedule is. A pending row, or one a relay holds, is
   * never deleted, even one that a requeue turns pending while the batch runs. Pass a pool: each
   * batch is then its own short transaction (on a client inside a transaction, they all commit with
   * it). Safe to run from several processes at once. A bad option rejects with a `TypeError`.
   *
   * Once a row is gone, `add()` with its id adds the event again (and it is sent again): keep rows
   * longer than a producer may add the same id.
   *
   * @example
   * const outbox = createOutbox({ table: 'webhook_outbox' });
   * // Every hour: delivered rows go after 30 days, dead letters 90 days after they died.
   * await outbox.purge(pool, { olderThan: '30d' });
   * const { deleted } = await outbox.purge(pool, { olderThan: '90d', dead: true, batchSize: 500 });
   */
  purge(db: Queryable, options: PurgeOptions): Promise<{ deleted: number }>;
}

// SQL lower-casing ASCII letters only, as JavaScript's toLowerCase() does to the names the sender
// sends: lower() follows the database's collation, and a Turkish one turns `I` into a dotless `ı`,
// so `X-ID` and `x-id` (or `Webhook-ID` and the signer's `webhook-id`) would compare as two names.
const asciiUpper = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ';
const asciiLowered = (text: string) => `translate(${text}, '${asciiUpper}', '${asciiUpper.toLowerCase()}')`;

// SQL for a headers object (jsonb) as the sender sends it, for add() to compare events by. Names
// lower-cased: HTTP field names are case-insensitive (RFC 9110 5.1), and the sender sends them
// lower-cased, so `X-Tenant: a` and `x-tenant: a` are one event. Values without the whitespace around
// them, which fetch trims (RFC 9110 5.5). Without the names that never go out as given: the sender
// drops `content-length`, `contentType` replaces `content-type` and the signer the `webhook-*` three.
// add() refuses all five now, but rows an earlier version stored may hold them, and the relay
// still sends those rows: a producer retrying such an event without them adds nothing.
// Rows keep the headers as the caller spelt them, as every version stored them: a producer of an
// earlier version, during a rolling upgrade, compares them exactly and still finds its own event the
// same. A row that holds one name in two spellings (stored before add() refused them) compares as
// the later in jsonb's key order, the value the relay sends for it.
const sentNotAsGiven = `(${headersNotSentAsGiven.map((name) => `'${name}'`).join(', ')})`;
const namesLowered = (headers: string) =>
  `coalesce((SELECT jsonb_object_agg(${asciiLowered('h.key')}, to_jsonb(btrim(h.value, E' \\t\\r\\n')) ORDER BY h.n)
               FROM jsonb_each_text(${headers}) WITH ORDINALITY AS h(key, value, n)
              WHERE ${asciiLowered('h.key')} NOT IN ${sentNotAsGiven}), '{}'::jsonb)`;

const IDENT = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

function quoteTable(name: string): { sql: string; base: string } {
  const parts = name.split('.');
  if (parts.length > 2 || !parts.every((part) => IDENT.test(part))) {
    throw new TypeError('table must be an identifier (letters, digits, _), optionally schema-qualified');
  }
  return { sql: parts.map((part) => `"${part}"`).join('.'), base: parts.at(-1) as string };
}

/**
 * The name of one of the table's indexes: `<table><suffix>` (`_due`, `_url`, `_delivered`, `_dead`).
 * PostgreSQL cuts identifiers to 63 bytes, so that name for a long table name would be cut to a name
 * another relation may have (the table itself, for 63 characters, or a sibling index), and CREATE
 * INDEX IF NOT EXISTS would skip it in silence, leaving every claim (or purge) to scan the table. A
 * name that does not fit keeps the table's first characters and a hash of the whole name, as the
 * PostgreSQL store names its own index. Table names are ASCII (see IDENT): characters are bytes.
 */
function indexName(base: string, suffix: string): string {
  const plain = `${base}${suffix}`;
  if (plain.length <= 63) return plain;
  const hash = createHash('sha256').update(base).digest('hex').slice(0, 8);
  return `${base.slice(0, 63 - suffix.length - hash.length - 1)}_${hash}${suffix}`;
}

// The indexes migrate() makes besides the primary key: the relay's due rows, one URL's waiting rows,
// and the three that keep each purge() batch (and each deadLetters() page, in its order) an index
// scan. A table that has millions of delivered rows would otherwise be read whole by every batch.
// Dead rows have two: deadLetters() lists them in the order they happened (`_dead`, created_at),
// which a requeue keeps, and purge() deletes them in the order they died (`_dead_at`). One index
// for both would leave one of them reading every dead row: a row that retried for a year and died
// yesterday is first in created_at order and last in dead_at order. `_dead_at` leads with dead_at,
// and a btree keeps the NULLs (rows dead before dead_at existed) together at its end, ordered by
// next_attempt_at, which their purge batch ages them by (see purgeSql).
// `_url` serves holdUrl (a 429 or a Retry-After) and disableUrl (a 410): without it each read every
// pending row through `_due` and kept one URL's, so a partner answering 429 cost as much as the whole
// backlog of every partner (100,000 pending rows read to hold 1,429).
const indexes = [
  { suffix: '_due', columns: ['next_attempt_at'], status: 'pending' },
  { suffix: '_url', columns: ['url', 'next_attempt_at'], status: 'pending' },
  { suffix: '_delivered', columns: ['delivered_at'], status: 'delivered' },
  { suffix: '_dead', columns: ['created_at', 'id'], status: 'dead' },
  { suffix: '_dead_at', columns: ['dead_at', 'next_attempt_at'], status: 'dead' },
] as const;

// The longest olderThan the cutoff takes, in ms (about 3,170 years): now() less a longer one falls
// before the earliest timestamp PostgreSQL holds, and the DELETE would fail. No row is that old.
const maxOlderThanMs = 1e14;

// jsonb cannot hold U+0000, and a response snippet may contain it (a binary acknowledgement): left
// as is, recording the attempt fails, the row stays leased, and the event is sent again after every
// lease, for ever. The stored text says where the NUL was.
const withoutNul = (_key: string, value: unknown) =>
  typeof value === 'string' ? value.replaceAll('\u0000', '\ufffd') : value;

function toRow(row: Record<string, any>): OutboxRow {
  return {
    id: row.id,
    url: row.url,
    status: row.status,
    attempts: row.attempts,
    createdAt: row.created_at,
    requeuedAt: row.requeued_at,
    deadReason: row.dead_reason,
    // A dead_at older than the last requeue is stale (see purgeSql): the row's death is not known.
    deadAt: row.dead_at && !(row.requeued_at && row.requeued_at > row.dead_at) ? row.dead_at : null,
    lastAttempt: row.last_attempt,
    history: row.history,
  };
}

/**
 * Creates a transactional outbox: `add(tx, event)` writes the event in the business transaction, and
 * relays deliver committed events with a {@link Sender}, at least once.
 *
 * Why it is safe:
 * - An event exists only if the business change committed, and it stays until a 2xx was recorded.
 * - Relays claim rows with `FOR UPDATE SKIP LOCKED` and a lease (`locked_until`), so several relays
 *   share the work without waiting on each other or taking the same row.
 * - A relay that crashes mid-delivery leaves its rows leased; when the lease ends another relay
 *   takes them over, records the lost attempt in their history and, after a backoff wait, delivers
 *   them again. The receiver absorbs that duplicate by `webhook-id`.
 * - Results are written only under the claim that made the attempt (`locked_by` and `claims`, which
 *   every claim raises and nothing lowers): a relay whose lease ran out cannot overwrite the outcome
 *   recorded by the claim that took over, even one made under the same `relayId`, even after a
 *   requeue reset the attempt count.
 * - Retries follow the sender's schedule, timed by PostgreSQL's clock (`now()`). A row taken over
 *   from a dead relay counts as a failed attempt: it waits out the backoff before the next one, so a
 *   row that kills every relay that sends it is not sent again after every lease. It is never
 *   attempted past `maxAttempts` or the horizon: it is dead-lettered. A takeover that dies too
 *   counts as well. A row found past either limit is dead-lettered by the claim itself.
 * - A 410 Gone dead-letters every waiting event for that URL (the endpoint asked to be disabled).
 *
 * @example
 * const outbox = createOutbox({ table: 'webhook_outbox' });
 * await outbox.migrate(pool);
 * const client = await pool.connect();
 * await client.query('BEGIN');
 * await client.query('UPDATE orders SET paid = true WHERE id = $1', [orderId]);
 * await outbox.add(client, { url: endpoint, body: { type: 'order.paid', orderId } });
 * await client.query('COMMIT');
 * client.release();
 * outbox.relay({ db: pool, sender }).start();
 */
export function createOutbox(options: OutboxOptions = {}): Outbox {
  if (options === null || typeof options !== 'object') throw new TypeError('createOutbox takes an options object');
  assertKnownOptions(options, new Set(['table']), 'createOutbox');
  const { sql: table, base } = quoteTable(options.table ?? 'idem_webhook_outbox');
  const name = options.table ?? 'idem_webhook_outbox';

  // A DO block's IF that creates `index` when the catalog has neither its name nor an index doing
  // its work (see migrate). `outbox` and `schema_name` are the block's variables.
  const createIndexIfMissing = (index: (typeof indexes)[number]) => {
    const indexed = indexName(base, index.suffix);
    return `
        IF to_regclass(format('%I.%I', schema_name, '${indexed}')) IS NULL
           AND NOT EXISTS (
             SELECT 1 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am m ON m.oid = i.relam
              WHERE x.indrelid = outbox AND x.indisvalid AND m.amname = 'btree' AND x.indexprs IS NULL
                AND x.indkey[0] = (SELECT attnum FROM pg_attribute
                                    WHERE attrelid = outbox AND attname = '${index.columns[0]}' AND NOT attisdropped)
                AND pg_get_expr(x.indpred, x.indrelid) = '(status = ''${index.status}''::text)')
        THEN
          CREATE INDEX IF NOT EXISTS "${indexed}" ON ${table} (${index.columns.join(', ')}) WHERE status = '${index.status}';
        END IF;`;
  };

  const migrate = async (db: Queryable, migrateOptions: OutboxMigrateOptions = {}) => {
    if (!db || typeof db.query !== 'function') throw new TypeError('migrate needs db (a pg Pool or client)');
    if (!migrateOptions || typeof migrateOptions !== 'object') throw new TypeError('migrate takes an options object');
    assertKnownOptions(migrateOptions, new Set(migrateOptionNames), 'migrate');
    const lockTimeoutMs =
      migrateOptions.lockTimeout === false
        ? undefined
        : toMilliseconds(migrateOptions.lockTimeout ?? '500ms', 'lockTimeout');
    const lockWaitMs = toMilliseconds(migrateOptions.lockWait ?? '30s', 'lockWait');
    // lock_timeout (55P03): the implicit transaction rolled back, nothing changed; the queue that
    // formed behind the waiting DDL is free again until the next try.
    await retryWithPauses(() => migrateOnce(db, lockTimeoutMs), {
      retryable: (error) => lockTimeoutMs !== undefined && (error as { code?: unknown })?.code === '55P03',
      budgetMs: lockWaitMs,
    });
  };

  const migrateOnce = async (db: Queryable, lockTimeoutMs: number | undefined) => {
    // One simple-protocol query runs as one implicit transaction; the advisory lock makes concurrent
    // migrations (several processes booting at once) wait instead of racing on the catalog. One lock
    // for every outbox: a table named two ways (`t` and `public.t`) must not get two.
    // Once the table is up to date, nothing here may wait on a lock a writer holds: a migrate() that
    // queues for one (behind a transaction that called add() and is still open) makes every relay
    // claim and every add() queue behind it. CREATE TABLE IF NOT EXISTS takes no lock on a table that
    // exists, but ALTER TABLE and CREATE INDEX IF NOT EXISTS lock the table before they look whether
    // there is anything to do, so each runs only when the catalog says it is needed, and so does
    // CREATE TABLE (even with IF NOT EXISTS it needs CREATE on the schema, which a role that may only
    // read and write the table lacks):
    // - a table made by an earlier version lacks `claims`, `requeued_at` or `dead_at`. Each is cheap
    //   to add: no default (`requeued_at`, `dead_at`) or a constant one (`claims`) rewrites no row;
    // - each index is looked up in the table's own schema (where CREATE INDEX puts it), whether the
    //   table was named with its schema or found on the search_path. An index that does the same work
    //   under another name (the `(created_at, id) WHERE status = 'dead'` the docs once told users to
    //   make for deadLetters()) counts too: a valid b-tree on the same leading column with the same
    //   predicate, which PostgreSQL writes back the same way however it was typed. Building a second
    //   one would block every add() for as long as the build takes, to no end. A name taken by
    //   something else is left alone (CREATE INDEX IF NOT EXISTS would lock the table, then skip).
    await db.query(`
      SELECT pg_advisory_xact_lock(hashtext('idem_webhook_outbox'));
      DO $$
      BEGIN
        IF to_regclass('${table}') IS NULL THEN
          CREATE TABLE ${table} (
            id text PRIMARY KEY,
            url text NOT NULL,
            body bytea NOT NULL,
            content_type text NOT NULL DEFAULT 'application/json',
            headers jsonb NOT NULL DEFAULT '{}'::jsonb,
            status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
            attempts integer NOT NULL DEFAULT 0,
            claims integer NOT NULL DEFAULT 0,
            created_at timestamptz NOT NULL DEFAULT now(),
            requeued_at timestamptz,
            next_attempt_at timestamptz NOT NULL DEFAULT now(),
            locked_until timestamptz,
            locked_by text,
            delivered_at timestamptz,
            dead_reason text,
            dead_at timestamptz,
            last_attempt jsonb,
            history jsonb NOT NULL DEFAULT '[]'::jsonb
          );
        END IF;
      END $$;
      DO $$
      DECLARE
        outbox regclass := '${table}'::regclass;
        schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                              WHERE c.oid = outbox);
      BEGIN
        -- Each change below waits at most this long for its lock (see OutboxMigrateOptions).
        ${lockTimeoutMs === undefined ? '' : `PERFORM set_config('lock_timeout', '${Math.max(1, Math.round(lockTimeoutMs))}ms', true);`}
        IF (SELECT count(*) FROM pg_attribute
             WHERE attrelid = outbox AND attname IN ('claims', 'requeued_at', 'dead_at') AND NOT attisdropped) < 3
        THEN
          ALTER TABLE ${table} ADD COLUMN IF NOT EXISTS claims integer NOT NULL DEFAULT 0,
                               ADD COLUMN IF NOT EXISTS requeued_at timestamptz,
                               ADD COLUMN IF NOT EXISTS dead_at timestamptz;
        END IF;
${indexes.map((index) => createIndexIfMissing(index)).join('')}      END $$;
    `);
  };

  const add = async (tx: Queryable, event: OutboxEvent) => {
    if (!tx || typeof tx.query !== 'function') throw new TypeError('add needs the transaction client (with query())');
    if (!event || (typeof event.url !== 'string' && !(event.url instanceof URL))) {
      throw new TypeError('add needs an event with a url');
    }
    const id = event.id ?? `evt_${randomUUID()}`;
    const url = String(event.url);
    // Refused here rather than stored to fail every attempt until the horizon.
    assertDeliverable({ ...event, url, id });
    const raw = event.body;
    const isBytes = typeof raw === 'string' || raw instanceof Uint8Array || raw instanceof ArrayBuffer;
    const json = isBytes ? undefined : JSON.stringify(raw);
    // JSON.stringify gives undefined for undefined, a function or a symbol: there is nothing to send.
    if (!isBytes && json === undefined) throw new TypeError('body must be bytes, a string or a JSON value');
    const body = isBytes ? toBodyBytes(raw) : Buffer.from(json as string, 'utf8');
    // Stored as fetch will parse it (the WHATWG href: host lower-cased, default port dropped, `/` for
    // an empty path), so that two spellings of one endpoint are one event to add() and one URL to the
    // relay's per-URL share, its hold after a 429 and its dead-lettering after a 410.
    const href = new URL(url).href;
    const contentType = event.contentType ?? 'application/json';
    const headers = JSON.stringify(event.headers ?? {});
    const values = [id, href, body, contentType, headers];
    // Without the event's body and headers, which PGlite puts on its errors as `params`.
    const query = (text: string, params: unknown[] = values) =>
      tx.query(text, params).catch((error: unknown) => {
        throw withoutCommandValues(error);
      });
    // A row deleted (purged) between the conflict and the look at it: the id is free again, and the
    // insert is tried again. Twice is enough unless something deletes the id as fast as it comes.
    for (let tries = 0; tries < 3; tries++) {
      const inserted = await query(
        `INSERT INTO ${table} (id, url, body, content_type, headers) VALUES ($1, $2, $3, $4, $5::jsonb)
         ON CONFLICT (id) DO NOTHING`,
      );
      if (inserted.rowCount === 1) return { id, added: true };
      // The id is taken: by this event (a retried producer, the point of the id) or by another one,
      // which `added: false` would lose while the producer believes it queued. An event is its url,
      // bytes, content type and headers (jsonb equality: key order does not count). A second
      // statement, so that under READ COMMITTED it sees a row a concurrent transaction committed
      // while the insert waited on it (the insert's own snapshot does not); under REPEATABLE READ or
      // SERIALIZABLE the insert fails with a serialization error instead. Only the verdict comes back.
      // Headers and content type compare as they will be sent, on both sides (see namesLowered and
      // contentTypeAsCompared). The url matches as stored now (the href) or, for a row an earlier
      // version stored, as the caller spelt it ($5). The content type comes back to be compared here:
      // its parameters (RFC 9110 5.6.6: quoted strings, names in any case) parse better in code than
      // in SQL; nothing else of the row does.
      const { rows } = await query(
        `SELECT (url = $2 OR url = $5) AND body = $3 AND ${namesLowered('headers')} = ${namesLowered('$4::jsonb')} AS same,
                content_type
           FROM ${table} WHERE id = $1`,
        [id, href, body, headers, url],
      );
      if (rows.length === 0) continue;
      if (rows[0].same === true && contentTypeAsCompared(rows[0].content_type) === contentTypeAsCompared(contentType))
        return { id, added: false };
      throw new WebhookError(
        'event_id_reused',
        'The outbox already holds another event (url, body, content type or headers) under this id: give a new event a new id.',
        { details: { id } },
      );
    }
    // Matched on by its code like every other error of the package: nothing was added, and add() in a
    // new transaction may succeed (retryable), where event_id_reused never will.
    throw new WebhookError(
      'event_id_contended',
      'The outbox row of this id was deleted each time add() looked at it; nothing was added.',
      { details: { id } },
    );
  };

  const relay = (relayOptions: RelayOptions): Relay => {
    if (!relayOptions || typeof relayOptions !== 'object') throw new TypeError('relay needs an options object');
    assertKnownOptions(relayOptions, new Set(relayOptionNames), 'relay');
    const { db, sender } = relayOptions;
    if (!db || typeof db.query !== 'function') throw new TypeError('relay needs db (a pg Pool or client)');
    if (!sender || typeof sender.attempt !== 'function') throw new TypeError('relay needs a sender');
    const batchSize = relayOptions.batchSize ?? 10;
    // A safe integer: pg would send 1e21 as "1e+21", which LIMIT refuses in every round.
    if (!Number.isSafeInteger(batchSize) || batchSize < 1)
      throw new TypeError(`batchSize must be a positive safe integer (at most ${Number.MAX_SAFE_INTEGER})`);
    // Half the slots by default: an endpoint that hangs keeps at most half of them for its timeout,
    // and the other endpoints' events go out through the rest.
    const maxPerUrl = relayOptions.maxPerUrl ?? Math.max(1, Math.floor(batchSize / 2));
    if (!Number.isSafeInteger(maxPerUrl) || maxPerUrl < 1 || maxPerUrl > batchSize)
      throw new TypeError('maxPerUrl must be a positive integer, at most batchSize');
    // By default the sender's timeout and 15 s, within the longest timer (see below): a timeout
    // near that limit must not make relay() refuse a `lease` nobody gave.
    const leaseMs =
      relayOptions.lease === undefined
        ? Math.min(sender.schedule.timeoutMs + 15_000, maxTimerMs)
        : toMilliseconds(relayOptions.lease, 'lease');
    if (leaseMs <= sender.schedule.timeoutMs)
      throw new TypeError(
        relayOptions.lease === undefined
          ? `the sender's timeout leaves no room for the relay's lease (at most ${maxTimerMs} ms): shorten it`
          : "lease must be longer than the sender's per-attempt timeout",
      );
    // A round is given up after its lease by a timer, which fires at once past Node's limit: every
    // round would fail with relay_round_timeout.
    if (leaseMs > maxTimerMs)
      throw new TypeError('lease must be at most 2147483647 ms (about 24.9 days, the longest timer Node keeps)');
    const pollMs = toMilliseconds(relayOptions.pollInterval ?? '1s', 'pollInterval');
    // 0 would query the database back to back, without a pause, for as long as the outbox is idle.
    if (pollMs < 10) throw new TypeError('pollInterval must be at least 10ms');
    const relayId = relayOptions.relayId ?? randomUUID();
    const { horizonMs, maxAttempts } = sender.schedule;
    const horizonParam = Number.isFinite(horizonMs) ? horizonMs : 1e15;
    const maxAttemptsParam = Number.isFinite(maxAttempts) ? maxAttempts : null;

    // The horizon counts from the event's creation, or from its last requeue (which gave it a fresh
    // one): the later of the two. `greatest` skips a NULL requeued_at (never requeued). During a
    // rolling upgrade, a requeue by the previous version moves created_at to now() and leaves an
    // older requeued_at behind: the later one is still the right start.
    const horizonEnds = (alias: string, param: string) =>
      `greatest(${alias}requeued_at, ${alias}created_at) + (${param}::double precision * interval '1 millisecond')`;

    // `history` with a LostAttempt appended if the row's last claim never recorded a result (every
    // write that ends a claim clears locked_by), from the columns that claim left: SET reads the row
    // as it was. Only for a statement that takes over a row whose lease is over (its WHERE says so)
    // and overwrites locked_by, so that each lost claim gets one entry, under the row lock.
    const withLost = (alias: string) =>
      `CASE WHEN ${alias}locked_by IS NULL THEN ${alias}history
            ELSE ${appended(
              `${alias}history`,
              `jsonb_build_object(
                   'attempt', ${alias}attempts, 'result', 'lost'::text, 'claim', ${alias}claims,
                   'relayId', ${alias}locked_by,
                   'leaseEndedAt', floor(extract(epoch FROM ${alias}locked_until) * 1000)::bigint,
                   'takenOverAt', floor(extract(epoch FROM now()) * 1000)::bigint)`,
            )} END`;

    // How both claim statements end: `picked` names the rows; each is locked (SKIP LOCKED: another
    // relay's claim may have taken it since it was read) and checked again under the lock, then
    // leased, or dead-lettered by the claim itself.
    // `crashed`: the row's last claim never recorded a result (every write that ends a claim clears
    // locked_by), so its relay died or stalled mid-attempt and its lease ran out. Read before the
    // UPDATE overwrites locked_by.
    // `stop`: the row may not be attempted again, and the claim dead-letters it itself. Either it
    // has used up its attempts (they count every claim, the crashed ones too), or an attempt was
    // made and the horizon has passed since (a first attempt is always made). A due row gets here
    // when its relay died (a takeover that dies before it can put the row back must not leave it to
    // the next takeover, for ever, each adding an attempt past maxAttempts), when the relays fell
    // behind, or when the schedule was shortened since the row was put back.
    // Neither a crashed row (see takeOver) nor a stopped one is sent by this claim, so its body is
    // not loaded: a body that kills the relay that loads it would otherwise kill every takeover too.
    // A crashed row's lost attempt gets its history entry here (withLost), in the statement that
    // takes the row over: so even when this relay dies right after, or the claim dead-letters the
    // row. last_attempt is left alone: it is the last result that came back, and none did.
    // dead_at is when a row was dead-lettered, on every path that does it (this claim, `ending`, a
    // 410's disableUrl, a hold's past the horizon): purge() ages dead rows by it. A claim, and the
    // write that ends it, set it afresh (null on a row they leave alive), so that a row requeued by
    // an earlier version (which knows no dead_at) does not keep the time it first died.
    const leaseSql = `due AS (
              SELECT id, locked_by IS NOT NULL AS crashed,
                     CASE WHEN attempts >= $5::double precision THEN 'max-attempts'
                          WHEN attempts >= 1 AND now() > ${horizonEnds('', '$4')} THEN 'horizon' END AS stop
                FROM ${table}
               WHERE id = ANY(ARRAY(SELECT id FROM picked))
                 AND status = 'pending'
                 AND next_attempt_at <= now()
                 AND (locked_until IS NULL OR locked_until <= now())
                 FOR UPDATE SKIP LOCKED),
              claimed AS (
         UPDATE ${table} AS o
            SET status = CASE WHEN due.stop IS NULL THEN o.status ELSE 'dead' END,
                dead_reason = coalesce(due.stop, o.dead_reason),
                dead_at = CASE WHEN due.stop IS NOT NULL THEN now() END,
                locked_until = CASE WHEN due.stop IS NULL
                                    THEN now() + ($2::double precision * interval '1 millisecond') END,
                locked_by = CASE WHEN due.stop IS NULL THEN $3::text END,
                attempts = o.attempts + CASE WHEN due.stop IS NULL THEN 1 ELSE 0 END,
                claims = o.claims + 1,
                history = ${withLost('o.')}
           FROM due
          WHERE o.id = due.id
        RETURNING o.id, o.url, CASE WHEN due.crashed OR due.stop IS NOT NULL THEN NULL ELSE o.body END AS body,
                  o.content_type, o.headers, o.status, o.attempts, o.claims, due.crashed,
                  floor(extract(epoch FROM now()) * 1000)::float8 AS database_now)`;

    // $6 and $7 of a claim: the URLs with room left and how much; $8: those with none.
    const roomParams = (room: ReadonlyMap<string, number>) => {
      const partly = [...room].filter(([, left]) => left > 0);
      return [
        partly.map(([url]) => url),
        partly.map(([, left]) => left),
        [...room].filter(([, left]) => left <= 0).map(([url]) => url),
      ];
    };

    // Always one row at least: a claim that took nothing still says whether rows were due (a row of
    // nulls and `more_due`), so a relay that lost every row it picked to another relay's claim
    // made at the same moment claims again at once instead of waiting out its poll.
    const claimedOf = (rows: unknown[]) =>
      (rows as (Claimed | { id: null })[]).filter((row): row is Claimed => row.id !== null);

    // How many of one URL's rows a claim may take, as `room` says for each URL this relay already
    // has rows of in flight (none for a URL missing from it): `maxPerUrl` less those. A claim reads
    // the due rows in due order, leaving out the URLs with no room, picks up to the room of each
    // URL among the first `2 × limit` of them, and leases the first `limit` picked. Without
    // a share, a backlog for one endpoint (a dead one that makes every attempt wait the whole
    // timeout, or a slow one) filled every claim, and every other endpoint's events waited behind
    // it. The candidates are read without a lock; the rows picked are locked (SKIP LOCKED) and
    // checked again under the lock, as another relay may have claimed one since.
    // `moreDue`: due rows were left out (for their URL's share, the limit, or another relay's claim
    // that took them first), so a claim made at once may find more (the loop claims again while it
    // has free slots). That is also why the candidates are few: when one URL's backlog fills them,
    // the claim made at once leaves that URL out, now at its share, and reads the rows behind it.
    // A window of `limit × maxPerUrl` rows read 1,250 rows a claim for a batch of 50 (and a claim
    // runs each time slots free): a relay's throughput against an instant endpoint fell by a third.
    // Leaving a URL out is a filter on the rows `_due` gives, so the rows of the URLs left out are
    // read all the same: with a dead endpoint's backlog at the head of the due rows, every claim
    // read that whole backlog before the first row it could take (31 ms a claim behind 200,000 due
    // rows, once per attempt that ends, for as long as the partner is down). So the claim reads a
    // bounded head of `_due` (claimSql, see headRows); only when that head left the claim short,
    // all of it rows left out or leased, does it reach further, through `_url`, one URL after
    // another from where the last such walk stopped (fallbackSql). Not the walk every time: it
    // costs about two index descents per URL with pending rows, far more than the head when there
    // are thousands of endpoints and no URL is left out. And a second statement, sent only then,
    // rather than the walk behind a condition in the first: PostgreSQL plans every part of a
    // statement, run or not, and the one statement took 1.2 ms to plan instead of 0.3 ms, so the
    // common claim took 2.5 ms instead of 1 ms. The head in a subquery, and no ORDER BY outside
    // it: the candidates come in its order, and the scan stops at the $9th (a sort there would read
    // the whole head every time). `capped` costs the common claim 0.05 ms, to plan the EXISTS.
    const claimSql = `WITH room AS (SELECT * FROM unnest($6::text[], $7::int[]) AS r(url, room)),
              candidate AS (
              SELECT id, url, next_attempt_at
                FROM (SELECT id, url, next_attempt_at, locked_until
                        FROM ${table}
                       WHERE status = 'pending'
                         AND next_attempt_at <= now()
                       ORDER BY next_attempt_at
                       LIMIT $10) AS head
               WHERE (locked_until IS NULL OR locked_until <= now())
                 AND url <> ALL($8::text[])
               LIMIT $9),
              picked AS (
              SELECT ranked.id
                FROM (SELECT id, url, next_attempt_at,
                             row_number() OVER (PARTITION BY url ORDER BY next_attempt_at, id) AS n
                        FROM candidate) AS ranked
                LEFT JOIN room ON room.url = ranked.url
               WHERE ranked.n <= coalesce(room.room, $11)
               ORDER BY ranked.next_attempt_at
               LIMIT $1),
              ${leaseSql}
         SELECT claimed.*, (SELECT count(*) FROM candidate) > (SELECT count(*) FROM claimed) AS more_due,
                CASE WHEN (SELECT count(*) FROM candidate) >= $9 THEN false
                     ELSE EXISTS (SELECT FROM ${table} WHERE status = 'pending' AND next_attempt_at <= now()
                                   ORDER BY next_attempt_at OFFSET $10 - 1) END AS capped
           FROM (VALUES (1)) AS one (x) LEFT JOIN claimed ON true`;

    // The rest of a claim whose head was used up (claimSql's `capped`): up to $1 more rows, from
    // the URLs with pending rows in the order of `_url`, starting after $10 (the URL where this
    // relay's last walk stopped) and wrapping round to the first, one URL per step: the next URL
    // (one descent, `min(url) > the last`), then its first due rows up to its room (a descent of
    // the URL's range in due order, past its leased rows). The URLs with no room ($8) are stepped
    // over without a look, so a dead URL's backlog costs one descent, not a read of it. It stops
    // once it has $1 rows, after $9 URLs looked at, or back where it started. Fair: a URL is looked
    // at once per lap, whatever its place in the due order, and the next walk begins after the
    // last URL this one looked at (`walked_to`): a walk bounded by the URLs it may look at does
    // not start from the first URL every time and starve the last ones. `more_due` when it was cut
    // short: URLs not looked at may have rows due.
    const fallbackSql = `WITH RECURSIVE room AS (SELECT * FROM unnest($6::text[], $7::int[]) AS r(url, room)),
              walk (step, url, lap, probes, got, ids) AS (
              -- The start in the url column's collation, as the URLs the walk steps to are: one
              -- given to the column (COLLATE "C") would otherwise differ from the parameter's, which
              -- a recursive query refuses. (No row: the subquery only lends its collation.)
              SELECT 0, coalesce((SELECT url FROM ${table} WHERE false), $10::text), 0, 0, 0::bigint, '{}'::text[]
              UNION ALL
              SELECT w.step + 1, nxt.url, nxt.lap, w.probes + CASE WHEN nxt.skip THEN 0 ELSE 1 END,
                     w.got + cardinality(found.ids), found.ids
                FROM walk AS w
               CROSS JOIN LATERAL (
                     SELECT after.url, after.lap, after.url = ANY($8::text[]) AS skip
                       FROM (SELECT coalesce(next.url, CASE WHEN w.lap = 0
                                                            THEN (SELECT min(url) FROM ${table} WHERE status = 'pending') END) AS url,
                                    CASE WHEN next.url IS NULL THEN 1 ELSE w.lap END AS lap
                               FROM (SELECT min(url) AS url FROM ${table}
                                      WHERE status = 'pending' AND url > w.url) AS next
                             -- Kept a subquery: pulled up, its expression (and its subqueries) would
                             -- be planned once for every place that names it.
                             OFFSET 0) AS after) AS nxt
               CROSS JOIN LATERAL (
                     SELECT CASE WHEN nxt.skip THEN '{}'::text[] ELSE ARRAY(
                              -- A range of one URL in the order of _url, as holdUrl reads (see urlIs).
                              SELECT id FROM ${table}
                               WHERE url >= nxt.url AND url <= nxt.url AND status = 'pending'
                                 AND next_attempt_at <= now()
                                 AND (locked_until IS NULL OR locked_until <= now())
                               ORDER BY url, next_attempt_at
                               LIMIT least(coalesce((SELECT room FROM room WHERE room.url = nxt.url), $11), $1 - w.got))
                            END AS ids) AS found
               WHERE w.probes < $9 AND w.got < $1
                 AND nxt.url IS NOT NULL AND NOT (nxt.lap = 1 AND nxt.url > $10::text)),
              picked AS (SELECT unnest(ids) AS id FROM walk WHERE step > 0),
              ${leaseSql}
         SELECT claimed.*,
                (SELECT count(*) FROM picked) > (SELECT count(*) FROM claimed)
                  OR (SELECT max(probes) >= $9 OR max(got) >= $1 FROM walk) AS more_due,
                (SELECT url FROM walk WHERE step > 0 ORDER BY step DESC LIMIT 1) AS walked_to
           FROM (VALUES (1)) AS one (x) LEFT JOIN claimed ON true`;

    // Where this relay's last walk (fallbackSql) stopped: the next one starts after it.
    let walkedTo = '';
    const claim = async (limit: number, room: ReadonlyMap<string, number> = new Map()) => {
      // A safe integer whatever the batch: pg would send a larger one as 1e+31, which LIMIT refuses.
      const window = Math.min(limit * 2, Number.MAX_SAFE_INTEGER);
      const first = await db.query(claimSql, [
        limit,
        leaseMs,
        relayId,
        horizonParam,
        maxAttemptsParam,
        ...roomParams(room),
        window,
        Math.min(Math.max(headRows, window * headPerWindow), Number.MAX_SAFE_INTEGER),
        // Last, as it always was: the share of a URL with nothing in flight.
        maxPerUrl,
      ]);
      const rows = claimedOf(first.rows);
      const capped = first.rows[0]?.capped === true;
      // Rows past the head were never looked at: due ones may be there.
      const moreDue = first.rows[0]?.more_due === true || capped;
      if (!capped || rows.length >= limit) return { rows, moreDue };
      // The rows just claimed count against their URLs' room, as the caller will count them.
      const left = new Map(room);
      for (const row of rows) if (row.status !== 'dead') left.set(row.url, (left.get(row.url) ?? maxPerUrl) - 1);
      const rest = await db.query(fallbackSql, [
        limit - rows.length,
        leaseMs,
        relayId,
        horizonParam,
        maxAttemptsParam,
        ...roomParams(left),
        Math.min(Math.max(minProbes, window), Number.MAX_SAFE_INTEGER),
        walkedTo,
        maxPerUrl,
      ]);
      const walked = rest.rows[0]?.walked_to;
      if (typeof walked === 'string') walkedTo = walked;
      return {
        rows: [...rows, ...claimedOf(rest.rows)],
        moreDue: first.rows[0]?.more_due === true || rest.rows[0]?.more_due === true,
      };
    };
    type Claimed = {
      id: string;
      url: string;
      /** Null for a crashed or dead-lettered row: neither is sent. */
      body: Buffer | null;
      content_type: string;
      headers: Record<string, string>;
      /** 'dead' when the claim itself dead-lettered the row; nothing more is written then. */
      status: 'pending' | 'dead';
      /** Counts this claim too, unless the claim dead-lettered the row. A requeue resets it. */
      attempts: number;
      /** The fencing token: every claim raises it, nothing lowers or resets it. */
      claims: number;
      crashed: boolean;
      /** The database's clock when the claim ran, epoch ms. */
      database_now: number;
    };

    // Every write that ends a claim is fenced by locked_by, `claims` and the attempt count: if this
    // relay's lease ran out and another claim took the row over (by another relay, or by one that
    // shares this relayId), the newer claim's outcome stands and this late one changes nothing.
    // `claims` is what makes the fence hold across a requeue, which resets `attempts` (so the same
    // relayId could claim the same count again). `attempts` stays in the fence for a relay of an
    // earlier version, which raises only `attempts`, taking over during a rolling upgrade.
    const fence = 'id = $1 AND locked_by = $2 AND claims = $3 AND attempts = $4';
    const fenceValues = (row: Claimed) => [row.id, relayId, row.claims, row.attempts];
    const statusOf = (rows: { status: OutboxRow['status'] }[]) => rows[0]?.status ?? 'fenced';

    // A write that ends a claim, tried again when it fails. Without it a result whose write met a
    // connection the pool had not yet seen die (a database restart, pg_terminate_backend, a pooler
    // recycling its servers) was lost, and the row was sent again once its lease ended: a second
    // delivery for an attempt that worked. Any error is retried: the fence makes a write that did
    // land the first time (its answer lost) change nothing the second time. That second time matches
    // no row, which would read as 'fenced' ("another claim took the row over") in the round's counts
    // and tell onAttempt that no attempt follows; so after a failed try, a write that matches nothing
    // reads back what the row holds if this claim is still its last one and has ended (locked_by
    // cleared with `claims` unchanged: only a write of this claim does that). The budget stays well
    // inside the lease, past which the fence refuses the write anyway.
    const endClaimBudgetMs = Math.min(1_000, leaseMs / 4);
    const endClaim = async (sql: string, values: unknown[]): Promise<{ rows: { status: OutboxRow['status'] }[] }> => {
      let failed = false;
      const result = await retryWithPauses(
        () =>
          db.query(sql, values).catch((error: unknown) => {
            failed = true;
            throw error;
          }),
        { retryable: () => true, budgetMs: endClaimBudgetMs },
      );
      if (!failed || result.rows.length > 0) return result as { rows: { status: OutboxRow['status'] }[] };
      const landed = await retryWithPauses(
        () =>
          db.query(`SELECT status FROM ${table} WHERE id = $1 AND claims = $2 AND locked_by IS NULL`, [
            values[0],
            values[2],
          ]),
        { retryable: () => true, budgetMs: endClaimBudgetMs },
      );
      return landed as { rows: { status: OutboxRow['status'] }[] };
    };

    // How a claim ends, in every query that ends one: the fence in $1 to $4, the wait before the next
    // attempt in $5, the horizon in $6. The first of `first` (a condition, a status, a dead_reason)
    // that holds decides; else the row is dead-lettered with 'horizon' if the wait would end past
    // the horizon, and put back to wait otherwise.
    const ending = (...first: [when: string, status: string, reason: string][]) => {
      const next = `now() + ($5::double precision * interval '1 millisecond')`;
      const branches = [...first, [`${next} > ${horizonEnds('', '$6')}`, "'dead'", "'horizon'"] as const];
      const choose = (column: 1 | 2, otherwise: string) =>
        `CASE ${branches.map((branch) => `WHEN ${branch[0]} THEN ${branch[column]}`).join(' ')} ELSE ${otherwise} END`;
      const status = choose(1, "'pending'");
      return {
        set: `status = ${status}, dead_reason = ${choose(2, 'NULL')}, dead_at = CASE WHEN ${status} = 'dead' THEN now() END,
              next_attempt_at = ${next}`,
        status,
      };
    };
    const endingValues = (row: Claimed, waitMs: number) => [...fenceValues(row), waitMs, horizonParam];

    // $7: delivered, $8: why the attempt ends the retries (410, the last attempt), $9: the attempt,
    // with the wait before the next one. The horizon is decided here, so a row it dead-letters keeps
    // its attempt without that wait: no attempt follows.
    const recordEnding = ending(['$7::boolean', "'delivered'", 'NULL'], ['$8::text IS NOT NULL', "'dead'", '$8::text']);
    const recorded = `CASE WHEN ${recordEnding.status} = 'pending' THEN $9::jsonb ELSE $9::jsonb - 'waitMs' END`;
    const recordSql = `UPDATE ${table}
            SET ${recordEnding.set},
                delivered_at = CASE WHEN $7::boolean THEN now() END,
                locked_until = NULL,
                locked_by = NULL,
                last_attempt = ${recorded},
                history = ${appended('history', recorded)}
          WHERE ${fence}
        RETURNING status`;
    const record = async (
      row: Claimed,
      attempt: AttemptRecord,
      delivered: boolean,
      stop: string | null,
      waitMs: number,
    ) => {
      // With its wait: the statement drops it from a row that ends (delivered, stopped, past the horizon).
      const { rows } = await endClaim(recordSql, [
        ...endingValues(row, waitMs),
        delivered,
        stop,
        JSON.stringify({ ...attempt, waitMs }, withoutNul),
      ]);
      return statusOf(rows);
    };

    // Ends a claim that makes no attempt: it gives back the attempt it counted. The row is put back
    // to wait `waitMs`, or dead-lettered with 'horizon' if the wait would end past it.
    const putBackSql = `UPDATE ${table}
            SET ${ending().set},
                attempts = attempts - 1,
                locked_until = NULL,
                locked_by = NULL
          WHERE ${fence}
        RETURNING status`;
    const putBack = async (row: Claimed, waitMs: number) =>
      statusOf((await endClaim(putBackSql, endingValues(row, waitMs))).rows);

    // holdUrl and disableUrl write one URL's waiting rows in batches of at most `urlBatchSize`, each
    // its own statement (its own short transaction on a pool), until a batch writes fewer. One
    // statement for the whole backlog held every row's lock until it ended: 8.7 s and 90,000 locks
    // for 90,000 rows, the other relays' claims (walking past the locked rows at the head of the
    // due index) 1,000 times slower meanwhile, and a larger backlog outlasted the round's lease.
    // A batch picks its rows through the `_url` index in due order (the rows the next claims would
    // reach first go first), locks them with SKIP LOCKED (a row another statement holds is left to
    // it: a claim leases it, another hold or 410 writes it), and the UPDATE finds them by primary
    // key, re-checking status and lease under the lock (as purge's batches do, for the same
    // reasons). A claim between two batches may send a row not yet written: one more 429 or 410,
    // answered the same way.
    // The URL is matched as a range of one value (`urlIs`), in the order of the `_url` index, not
    // with `url = $1` in due order: for an equality PostgreSQL drops the URL from the order, and
    // then may walk `_due` instead, reading every other URL's pending row due before this URL's
    // (measured: 50,000 of them, 9 ms, for each batch of a URL whose rows were due last). Only
    // `_url` gives (url, next_attempt_at) order, so each batch reads its own rows and no others.
    const urlBatchSize = 1_000;
    const urlIs = `url >= $1 AND url <= $1`;
    const urlOrder = 'ORDER BY url, next_attempt_at';

    // A row whose relay died and that no claim has taken over yet is taken over here: its lost
    // attempt gets its entry, as in a claim. Each batch makes its rows dead, which takes them out of
    // the next batch's selection, so the loop ends once the URL has no waiting row left to take.
    const disableSql = `UPDATE ${table}
            SET status = 'dead', dead_reason = 'gone', locked_until = NULL, locked_by = NULL, dead_at = now(),
                history = ${withLost('')}
          WHERE id = ANY(ARRAY(
                  SELECT id FROM ${table}
                   WHERE ${urlIs} AND status = 'pending' AND (locked_until IS NULL OR locked_until <= now())
                   ${urlOrder}
                   LIMIT $2
                     FOR UPDATE SKIP LOCKED))
            AND status = 'pending' AND (locked_until IS NULL OR locked_until <= now())`;
    // Like a hold, it only spares the others an attempt each: one that fails is reported, never the
    // answered row's failure (its result is recorded), and the batches written before it count.
    const disableUrl = async (url: string, more: () => boolean) => {
      let dead = 0;
      try {
        for (;;) {
          const { rowCount } = await db.query(disableSql, [url, urlBatchSize]);
          dead += rowCount ?? 0;
          if ((rowCount ?? 0) < urlBatchSize || !more()) return dead;
        }
      } catch (error) {
        notify(relayOptions.onError, withoutCommandValues(error));
        return dead;
      }
    };

    // An endpoint that answered 429, or any status with a Retry-After (a 503 during maintenance), spoke
    // for itself, not for the one event: its other waiting events wait as if each had been answered
    // the same on a first attempt (the Retry-After, up to maxRetryAfter, or a first retry's backoff),
    // so a backlog does not keep knocking at the rate the endpoint asked to leave. Not the answered
    // row's own wait: deep in its retries that is its backoff, up to the cap, far longer than the
    // endpoint asked. None counts an attempt, none is moved earlier, and leased rows (in flight with
    // another claim) are left to it. A row already attempted whose horizon ends before the hold does
    // is dead-lettered now, as its own wait past the horizon would have it ('horizon'), with the lost
    // attempt of a crashed claim recorded as a takeover would (withLost). Returns how many it
    // dead-lettered; a hold that fails only lets the others be tried sooner: reported, never the row's
    // failure (the batches written before it stay written, and their dead-lettered rows count).
    // A row already put off to within `slack` of this hold is left as it is. The rows of one round
    // are answered a few milliseconds apart, and each answer's hold ends that much later: without
    // the slack every hold of the round rewrote every waiting row of the URL again (a round of 10
    // answers wrote 450,000 row versions for 90,000 waiting rows, and held their locks for 36 s).
    // A second is Retry-After's own precision; a tenth of a shorter hold keeps a short one short.
    // The hold ends at one time for all its batches: the first batch reckons it from the database's
    // clock (`now()` plus the hold, in $2) and the others are given it (epoch microseconds, as text:
    // exact, whatever the driver makes of a bigint or the session of a date, in $2). Reckoned
    // again by each batch, it would end later with every batch, and once the batches had taken
    // longer than the slack, the rows the first ones held would fall short of it and be picked (and
    // rewritten) again, batch after batch, and the loop would end only by its time budget. At one
    // end, a row a batch held is past the selection's bound: each batch takes rows no batch took,
    // or is the last.
    const holdSql = (until: string) => {
      const pastHorizon = `(attempts >= 1 AND ${until} > ${horizonEnds('', '$3')})`;
      return `UPDATE ${table}
              SET status = CASE WHEN ${pastHorizon} THEN 'dead' ELSE status END,
                  dead_reason = CASE WHEN ${pastHorizon} THEN 'horizon' ELSE dead_reason END,
                  dead_at = CASE WHEN ${pastHorizon} THEN now() ELSE dead_at END,
                  history = CASE WHEN ${pastHorizon} THEN ${withLost('')} ELSE history END,
                  locked_until = CASE WHEN ${pastHorizon} THEN NULL ELSE locked_until END,
                  locked_by = CASE WHEN ${pastHorizon} THEN NULL ELSE locked_by END,
                  next_attempt_at = ${until}
            WHERE id = ANY(ARRAY(
                    SELECT id FROM ${table}
                     WHERE ${urlIs} AND status = 'pending'
                       AND next_attempt_at < ${until} - ($4::double precision * interval '1 millisecond')
                       AND (locked_until IS NULL OR locked_until <= now())
                     ${urlOrder}
                     LIMIT $5
                       FOR UPDATE SKIP LOCKED))
              AND status = 'pending' AND (locked_until IS NULL OR locked_until <= now())
        RETURNING status, (extract(epoch FROM next_attempt_at) * 1000000)::bigint::text AS until_us`;
    };
    const holdFirstSql = holdSql(`now() + ($2::double precision * interval '1 millisecond')`);
    const holdNextSql = holdSql(`('epoch'::timestamptz + $2::bigint * interval '1 microsecond')`);
    const holdUrl = async (url: string, retryAfterMs: number | undefined, more: () => boolean): Promise<number> => {
      const holdMs = sender.nextDelay(1, retryAfterMs);
      const slackMs = Math.min(1_000, holdMs / 10);
      let dead = 0;
      let untilUs: string | undefined;
      try {
        for (;;) {
          const { rows } = await db.query(untilUs === undefined ? holdFirstSql : holdNextSql, [
            url,
            untilUs ?? holdMs,
            horizonParam,
            slackMs,
            urlBatchSize,
          ]);
          const written = rows as { status: string; until_us: string }[];
          dead += written.filter((row) => row.status === 'dead').length;
          if (written.length < urlBatchSize || !more()) return dead;
          untilUs ??= (written[0] as { until_us: string }).until_us;
        }
      } catch (error) {
        notify(relayOptions.onError, withoutCommandValues(error));
        return dead;
      }
    };

    // A row whose relay died mid-attempt, taken over: that attempt may have reached the endpoint, and
    // the row itself may be what killed the relay (a body that crashes a serialiser, a response that
    // exhausts memory). It is counted as a failed attempt and waits out the same backoff before the
    // next one, instead of being sent again at once after every lease, by every relay in turn.
    // A takeover that dies itself before putting the row back keeps the count its claim took, so even
    // a row that kills relays before they send it moves towards maxAttempts; the claim that finds it
    // there dead-letters it (so does one past the horizon), and no takeover gets here with it.
    const takeOver = (row: Claimed) => putBack(row, sender.nextDelay(Math.max(1, row.attempts - 1)));

    // `heard`: told whether the endpoint answered at all (the loop gives an endpoint that does not
    // one slot until it does, see relay-slots.ts).
    const send = async (
      row: Claimed,
      round: RelayRound,
      clock: () => number,
      more: () => boolean,
      heard?: (answered: boolean) => void,
    ) => {
      // Only a crashed or dead-lettered row's body is null, and neither is sent.
      const attempt = await sender.attempt(
        { url: row.url, id: row.id, body: row.body as Buffer, contentType: row.content_type, headers: row.headers },
        row.attempts,
        { now: clock },
      );
      heard?.(attempt.result !== 'timeout' && attempt.result !== 'network-error');
      const delivered = attempt.result === 'delivered';
      const stop =
        attempt.result === 'gone' ? 'gone' : !delivered && row.attempts >= maxAttempts ? 'max-attempts' : null;
      const waitMs = delivered || stop ? 0 : sender.nextDelay(row.attempts, attempt.retryAfterMs);
      // Told once recorded, with the wait that follows only when the row waits for another attempt
      // (the database decides the horizon; a failed recording has none). An observer must never break
      // the relay, whether it throws or rejects.
      const tell = (waits: boolean) =>
        notify(relayOptions.onAttempt, { id: row.id, url: row.url }, waits ? { ...attempt, waitMs } : { ...attempt });
      let status: Awaited<ReturnType<typeof record>>;
      try {
        status = await record(row, attempt, delivered, stop, waitMs);
      } catch (error) {
        tell(false);
        throw error;
      }
      tell(status === 'pending');
      // 410 says the endpoint is gone (Standard Webhooks: disable it), not just this event: the
      // other events waiting for the same URL are dead-lettered too instead of each finding out.
      if (stop === 'gone' && status === 'dead') round.dead += await disableUrl(row.url, more);
      // Whatever became of this row (waiting, or dead on its last attempt): the endpoint asked all the
      // same. Not when this claim was fenced off: the claim that took the row over decides.
      else if (
        status !== 'fenced' &&
        !delivered &&
        stop !== 'gone' &&
        (attempt.status === 429 || attempt.retryAfterMs !== undefined)
      )
        round.dead += await holdUrl(row.url, attempt.retryAfterMs, more);
      return status;
    };

    // Whether a hold or a 410's dead-lettering may write one more batch of a URL's rows (it always
    // writes the first): not once three quarters of the round's lease have passed, nor once stop()
    // was called. The round must end within its lease, or runOnce gives it up (relay_round_timeout)
    // and the batches go on in the background, past stop(); the last quarter is left for the batch
    // in flight and the round's other rows to record their results. A shutdown waits for the round's
    // attempts, not for a backlog no attempt is waiting on. The rows left are the URL's latest due
    // (the batches go in due order): the next claim that reaches one sends it, and the answer (one
    // more 429 or 410) writes the next batches.
    const batchesWhile = (signal: AbortSignal | undefined) => {
      const ends = performance.now() + leaseMs * 0.75;
      return () => performance.now() < ends && !signal?.aborted;
    };

    // Attempts are signed (webhook-timestamp) by the database's clock, the one that schedules them,
    // carried forward by this process's monotonic clock: a relay host whose wall clock is minutes
    // off would otherwise send signatures every receiver refuses as too old or too new, and dates
    // in its history that disagree with next_attempt_at.
    const clockOf = (rows: Claimed[]) => {
      const claimedAt = performance.now();
      const databaseNow = rows[0]?.database_now ?? 0;
      return () => databaseNow + (performance.now() - claimedAt);
    };

    // One claimed row to its end: a row dead-lettered by its claim is done already, a crashed one is
    // put back, any other gets its attempt.
    const workOn = (
      row: Claimed,
      round: RelayRound,
      clock: () => number,
      more: () => boolean,
      heard?: (answered: boolean) => void,
    ) =>
      row.status === 'dead'
        ? Promise.resolve('dead' as const)
        : row.crashed
          ? takeOver(row)
          : send(row, round, clock, more, heard);

    const runRound = async (signal: AbortSignal | undefined): Promise<RelayRound> => {
      const more = batchesWhile(signal);
      // Claims until the batch is full or no more rows are due, as the loop does (a claim reads few
      // candidates: a URL at its share is left out of the next one), a few claims at most.
      const rows: { row: Claimed; clock: () => number }[] = [];
      const room = new Map<string, number>();
      for (let claims = 0; claims < 4 && rows.length < batchSize; claims++) {
        const got = await claim(batchSize - rows.length, room);
        const clock = clockOf(got.rows);
        for (const row of got.rows) {
          rows.push({ row, clock });
          if (row.status !== 'dead') room.set(row.url, (room.get(row.url) ?? maxPerUrl) - 1);
        }
        if (!got.moreDue) break;
      }
      const round: RelayRound = { claimed: rows.length, delivered: 0, retrying: 0, dead: 0, fenced: 0 };
      // Settle every row before the round ends, even when one fails: stop() promises the round in
      // flight is over, and a caller may close the pool right after it.
      const settled = await Promise.allSettled(
        rows.map(async ({ row, clock }) => {
          const status = await workOn(row, round, clock, more);
          if (status === 'pending') round.retrying++;
          else round[status]++;
        }),
      );
      const failed = settled.find((result) => result.status === 'rejected');
      if (failed) throw failed.reason;
      return round;
    };

    // Work whose query never returns (a database host gone silent, without a reset) would hold the
    // round, or the loop's slot, and stop(), for ever. Past its lease nothing it does counts (another
    // claim may hold its rows, and the fence refuses its results), so it is given up then and
    // reported; if the query ever returns, the work finishes in the background and its late
    // results are fenced off.
    const withinLease = <T>(work: Promise<T>, message: string, details: Record<string, unknown>): Promise<T> => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const deadline = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new WebhookError('relay_round_timeout', message, { details: { leaseMs, ...details } })),
          leaseMs,
        );
      });
      return Promise.race([work, deadline]).finally(() => clearTimeout(timer));
    };

    let running: Promise<void> | undefined;
    let stopping: AbortController | undefined;

    // The background loop keeps up to batchSize rows in flight, each on its own lease, and claims
    // again as soon as one ends (relay-slots.ts). `signal`: the loop's, which stop() aborts.
    const loop = (signal: AbortSignal) =>
      runSlots<{ url: string; row: Claimed; clock: () => number }>(
        {
          slots: batchSize,
          maxPerUrl,
          pollMs,
          claim: async (limit, room) => {
            const { rows, moreDue } = await withinLease(
              claim(limit, room),
              'The relay did not finish a claim within its lease.',
              {},
            );
            const clock = clockOf(rows);
            return {
              work: rows.filter((row) => row.status !== 'dead').map((row) => ({ url: row.url, row, clock })),
              claimed: rows.length,
              moreDue,
            };
          },
          // The counts of a round are runOnce()'s; the loop's rows are told through onAttempt.
          work: async ({ row, clock }) => {
            let answered: boolean | undefined;
            const round = { claimed: 1, delivered: 0, retrying: 0, dead: 0, fenced: 0 };
            const heard = (value: boolean) => {
              answered = value;
            };
            await withinLease(
              workOn(row, round, clock, batchesWhile(signal), heard),
              'The relay did not finish a row within its lease.',
              { id: row.id },
            );
            return answered;
          },
          // Without the failed statement's values (PGlite's `params`: bodies, partner answers).
          onError: (error) => notify(relayOptions.onError, withoutCommandValues(error)),
        },
        signal,
      );

    return {
      relayId,
      runOnce: () => withinLease(runRound(undefined), 'The relay round did not finish within its lease.', {}),
      start() {
        if (stopping !== undefined && !stopping.signal.aborted) return;
        // A start while a stop() is still waiting for its round is a restart: the new loop begins once
        // the old one has ended, so two loops never run at once, and the stop cannot undo it.
        const controller = new AbortController();
        const previous = running ?? Promise.resolve();
        stopping = controller;
        running = previous.then(() => loop(controller.signal));
      },
      async stop() {
        const stopped = running;
        stopping?.abort();
        await stopped;
        if (running === stopped) running = undefined;
      },
    };
  };

  const deadLetters = async (db: Queryable, listOptions: DeadLetterOptions = {}): Promise<DeadLetterPage> => {
    if (!db || typeof db.query !== 'function') throw new TypeError('deadLetters needs db (a pg Pool or client)');
    if (!listOptions || typeof listOptions !== 'object') throw new TypeError('deadLetters takes an options object');
    // A misspelt `after` would be ignored: every page the first one, and a pager that reads until
    // `next` is undefined would never end.
    assertKnownOptions(listOptions, new Set(deadLetterOptionNames), 'deadLetters');
    const limit = listOptions.limit ?? 100;
    // A safe integer, as the relay's batchSize.
    if (!Number.isSafeInteger(limit) || limit < 1)
      throw new TypeError(`limit must be a positive safe integer (at most ${Number.MAX_SAFE_INTEGER})`);
    const after = listOptions.after === undefined ? undefined : decodeCursor(listOptions.after);
    // Keyset pagination on (created_at, id): a page starts after the last row of the one before, so
    // rows dead-lettered or requeued meanwhile never shift the others to a page already read (as an
    // OFFSET would). A requeue keeps created_at, so a row that dies again keeps its place. One row
    // more than the page says whether there is a next one.
    const { rows } = await db.query(
      `SELECT id, url, status, attempts, created_at, requeued_at, dead_reason, dead_at, last_attempt, history,
              to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') AS position
         FROM ${table}
        WHERE status = 'dead'
          AND ($2::text IS NULL OR (created_at, id) > ($2::timestamp AT TIME ZONE 'UTC', $3::text))
        ORDER BY created_at, id
        LIMIT $1`,
      [limit + 1, after?.createdAt ?? null, after?.id ?? null],
    );
    const page = rows.slice(0, limit);
    const last = page.at(-1);
    return {
      rows: page.map(toRow),
      next: rows.length > limit && last ? encodeCursor({ createdAt: last.position, id: last.id }) : undefined,
    };
  };

  const requeue = async (db: Queryable, id: string) => {
    if (!db || typeof db.query !== 'function') throw new TypeError('requeue needs db (a pg Pool or client)');
    // Anything else matches no row, and `false` would read as "not dead" instead of a caller's bug.
    if (typeof id !== 'string') throw new TypeError('requeue needs the id of a dead event (a string)');
    // created_at stays: it is when the event happened, and the order deadLetters() lists in. The
    // horizon restarts from requeued_at instead. `claims` stays too: it is the fencing token, and
    // resetting it would let a claim from before the requeue match a claim after it.
    const result = await db.query(
      `UPDATE ${table} SET status = 'pending', dead_reason = NULL, dead_at = NULL, next_attempt_at = now(), requeued_at = now(),
              attempts = 0, locked_until = NULL, locked_by = NULL
        WHERE id = $1 AND status = 'dead'`,
      [id],
    );
    return result.rowCount === 1;
  };

  // One batch of purge(), for delivered rows or dead ones: $1 rows at most, older than $2 ms. The
  // inner SELECT walks the kind's partial index in order and stops after $1 rows, locking each one
  // (SKIP LOCKED: a row a requeue, a relay or another purge holds is left for the next call). The
  // outer DELETE finds them by primary key: `id IN (SELECT ...)` let the planner hash-join the batch
  // against a scan of the whole table (or of the whole partial index), every batch; and the age is
  // not said again there, or the planner may walk the kind's index for it instead of the key. The
  // status is: the row deleted is the row that was selected, and a row a requeue turned pending after
  // the statement's snapshot is re-read under its lock and no longer matches. (A requeue is the one
  // write that moves the age of a delivered or dead row, and it makes the row pending.) A delivered
  // or dead row holds no lease (every statement that ends a claim clears it); the lease is checked
  // all the same, so that no row a relay holds could ever go. now() is the statement's own
  // transaction's start on a pool, and a stable value: the index can use it. A requeue clears
  // dead_at, and every statement that dead-letters a row sets it, so no other write moves a dead
  // row's age either.
  const cutoff = `now() - ($2::double precision * interval '1 millisecond')`;
  const purgeBatch = (status: 'delivered' | 'dead', old: string, order: string) =>
    `DELETE FROM ${table}
      WHERE id = ANY(ARRAY(
              SELECT id FROM ${table}
               WHERE status = '${status}' AND ${old}
               ORDER BY ${order}
               LIMIT $1
                 FOR UPDATE SKIP LOCKED))
        AND status = '${status}' AND (locked_until IS NULL OR locked_until <= now())`;
  const purgeSql = {
    delivered: purgeBatch('delivered', `delivered_at < ${cutoff}`, 'delivered_at'),
    // From when the row died: a row that retried for a year and died yesterday is a day old here.
    // Ordered as `_dead_at` is, so the scan reads that index in order and stops after $1 rows.
    // A dead_at older than requeued_at is stale: a relay of an earlier version requeued the row
    // (keeping the first death's dead_at) and dead-lettered it again without one. Such a row is aged
    // as one without dead_at is; its dead_at is still older than the cutoff, so the index bound holds.
    dead: purgeBatch(
      'dead',
      `dead_at < ${cutoff}
                 AND (requeued_at IS NULL OR requeued_at <= dead_at
                      OR (requeued_at < ${cutoff} AND next_attempt_at < ${cutoff}))`,
      'dead_at, next_attempt_at',
    ),
    // A row dead-lettered before dead_at existed (by an earlier version, or by a relay of one during
    // a rolling upgrade) has none. Its age is the later of created_at, requeued_at and
    // next_attempt_at: every version's last write to a row it dead-lettered set next_attempt_at to
    // then (a failed last attempt, a 410), to a wait that would have passed the horizon (later), or
    // left the time the row fell due (a claim past its limits, a 410 of another event: earlier, by
    // as long as the relays were behind). Never younger than created_at and requeued_at alone, the
    // age those versions purged by: the upgrade deletes no such row sooner than they would have.
    // The IS NULL keeps the scan to the NULLs at the end of `_dead_at`, in next_attempt_at order,
    // and the ORDER BY is the index's own, so no sort reads them all first.
    deadBefore: purgeBatch(
      'dead',
      `dead_at IS NULL AND next_attempt_at < ${cutoff} AND created_at < ${cutoff}
                 AND (requeued_at IS NULL OR requeued_at < ${cutoff})`,
      'dead_at, next_attempt_at',
    ),
  };

  const purge = async (db: Queryable, purgeOptions: PurgeOptions): Promise<{ deleted: number }> => {
    if (!db || typeof db.query !== 'function') throw new TypeError('purge needs db (a pg Pool or client)');
    if (!purgeOptions || typeof purgeOptions !== 'object')
      throw new TypeError("purge needs options with olderThan (such as { olderThan: '30d' })");
    assertKnownOptions(purgeOptions, new Set(purgeOptionNames), 'purge');
    const { olderThan, dead = false, batchSize = 1000, signal } = purgeOptions;
    // No default: a wrong guess deletes what a producer may still add again (see the TSDoc).
    if (olderThan === undefined) throw new TypeError("purge needs olderThan (such as '30d')");
    const olderThanMs = Math.min(toMilliseconds(olderThan, 'olderThan'), maxOlderThanMs);
    if (typeof dead !== 'boolean') throw new TypeError('dead must be true or false');
    // A safe integer: pg would send 1e21 as "1e+21", which LIMIT refuses on every batch.
    if (!Number.isSafeInteger(batchSize) || batchSize < 1)
      throw new TypeError(`batchSize must be a positive safe integer (at most ${Number.MAX_SAFE_INTEGER})`);
    if (signal !== undefined && !(signal instanceof AbortSignal)) throw new TypeError('signal must be an AbortSignal');
    let deleted = 0;
    for (const sql of dead ? [purgeSql.delivered, purgeSql.dead, purgeSql.deadBefore] : [purgeSql.delivered]) {
      for (;;) {
        if (signal?.aborted) return { deleted };
        const { rowCount } = await db.query(sql, [batchSize, olderThanMs]);
        deleted += rowCount ?? 0;
        // Fewer than a batch: nothing more is old enough, or the rest is locked (left for next time).
        if ((rowCount ?? 0) < batchSize) break;
      }
    }
    return { deleted };
  };

  return { table: name, migrate, add, relay, deadLetters, requeue, purge };
}
