import { randomBytes } from 'node:crypto';
import type { Database } from '../db.js';
import { sha256Id } from '../sha256-id.js';
import { providerRequestsPerRefresh, providerTimeoutMs } from './oidc-client.js';
import { openTokens, sealTokens } from './sealed-tokens.js';
import type { PendingSignIn, SessionTokens, SignedInUser } from './session-values.js';

// The values of a session, in a module of their own so that the provider client and the token seal
// read them without importing this one (which imports both).
export type { PendingSignIn, SessionTokens, SignedInUser } from './session-values.js';

/**
 * A {@link PendingSignIn} as the session table keeps it: its `state` only as a SHA-256 (`stateHash`).
 * The callback's lookup is all the state is for, and a reader of the table who held it, next to the
 * nonce and the PKCE verifier, could forge the callback of a sign-in in progress (login CSRF: the
 * victim's browser signed in to the reader's account). The nonce and the verifier are presented in
 * clear (compared with the ID token's, sent to the token endpoint), so they are kept as they are.
 */
export interface StoredSignIn {
  stateHash: string;
  nonce: string;
  codeVerifier: string;
  returnTo: string;
}

/** A one-shot message shown on the next page (post/redirect/get). */
export interface Flash {
  title: string;
  lines: string[];
  /** After a charge: what "Send the same charge again" re-sends, with the same key. */
  repeat?: { key: string; amount: number; currency: string } | undefined;
  /**
   * After a charge: its key, and whether this message settles it (the charge went through, the API
   * refused it and ran nothing, or refused other details under its key). The page that shows a
   * settling message ends the session's {@link OpenCharge} of that key; an unknown outcome keeps it.
   */
  charge?: { key: string; settled: boolean } | undefined;
}

/**
 * A charge the person sent whose outcome no page has shown yet: its answer may have been lost (the
 * connection dropped, Stop, a closed tab) after the API made it. Until a page shows that outcome, the
 * charge form comes back with this key and these details, so sending it again replays the charge
 * instead of making a second one (spec 2.1: the same key on every retry of one operation).
 */
export interface OpenCharge {
  key: string;
  amount: number;
  currency: string;
  /**
   * What the app learnt from the API: `created` (a 201, first or replayed), `refused` (a 4xx that ran
   * nothing); absent while unknown (in flight, or every attempt ended without an answer).
   */
  outcome?: 'created' | 'refused' | undefined;
}

/**
 * Everything one browser session holds. A session is either a sign-in in progress (`pending`: one
 * transaction per "Sign in" pressed in this browser, by `state`, so two tabs do not undo each other)
 * or signed in (`user`, `tokens`). Messages to show wait in `flashes`, each under its own slot, which
 * the page that shows it names: two tabs never take each other's.
 */
export interface SessionData {
  pending?: StoredSignIn[];
  user?: SignedInUser;
  tokens?: SessionTokens;
  flashes?: Record<string, Flash>;
  /** At most one per session: the first charge sent while none was open (see {@link OpenCharge}). */
  openCharge?: OpenCharge;
  /**
   * When the user gave the password (the ID token's `auth_time`, epoch seconds): the session ends
   * `lifetimeSeconds` after it too. Set at sign-in only; absent in a row an earlier version wrote.
   */
  authTime?: number;
}

/** What {@link SessionStore.create} takes: {@link SessionData}, its sign-ins in progress as the flow made them. */
export type NewSessionData = Omit<SessionData, 'pending'> & { pending?: PendingSignIn[] };

/** At most this many sign-ins in progress per browser; a further one drops the oldest. */
export const maxPendingSignIns = 5;

/**
 * Server-side sessions on the shared database.
 *
 * @example
 * ```ts
 * const sessions = createSessionStore(db, { ttlSeconds: 3600 });
 * const id = await sessions.create({ pending }, 600);
 * const data = await sessions.get(id);
 * ```
 */
export interface SessionStore {
  /**
   * A new session for `ttlSeconds` (the store's TTL by default), its sign-ins in progress given as they
   * are (their state is stored hashed). Also deletes a batch of expired rows.
   */
  create(data: NewSessionData, ttlSeconds?: number): Promise<string>;
  get(id: string | undefined): Promise<SessionData | undefined>;
  /**
   * Claims the refresh of the session's tokens for `claim` (the caller's own value, unique to this
   * refresh) for {@link refreshLeaseSeconds}, in one statement, unless another claim holds it and its
   * time has not passed; returns the session as it is when claimed. Undefined when it is not claimed:
   * another refresh is under way (in this process or another one), or there is no signed-in session.
   * Refreshes of one session then run one at a time across every app process on the database: two
   * would present one refresh token twice, which the provider takes for reuse and revokes the grant.
   * The claim is a row's value, no lock held: the provider is called with no transaction open (on
   * PGlite's single connection one would stop every other statement, the provider's own included),
   * and a process that dies while it holds a claim keeps it only until its time passes.
   */
  claimRefresh(id: string, claim: string): Promise<SessionData | undefined>;
  /**
   * Stores the refreshed `changes` and ends the claim, if `claim` is still the session's; false when it
   * is not (taken over after its time, or the session is gone): nothing is written then.
   *
   * Changes only the fields named in `changes` (a field given as `undefined` is removed) and leaves
   * every other field as the database holds it now, not as the caller read it: a request that read
   * the session before a slow call must not write back a refresh token that a concurrent refresh
   * has used up meanwhile (the provider would take it for reuse and revoke the grant). It also
   * extends the session to the store's full `ttlSeconds` (a signed-in session in use stays alive), never
   * past its `lifetimeSeconds` from its creation; only signed-in sessions (those with a `user`) are
   * updated, so a pending sign-in keeps its short life and its data: the sign-in's callback starts a
   * new session instead.
   */
  finishRefresh(
    id: string,
    claim: string,
    changes: { [K in keyof SessionData]?: SessionData[K] | undefined },
  ): Promise<boolean>;
  /** Ends `claim` with nothing stored (no refresh was due after all, or the provider could not be reached). */
  releaseRefresh(id: string, claim: string): Promise<void>;
  /**
   * Sets one flash slot of a signed-in session, leaving the others (set by other tabs) as they are,
   * and extends the session as {@link SessionStore.finishRefresh} does.
   */
  setFlash(id: string, slot: string, flash: Flash): Promise<void>;
  /** Removes one flash slot and returns it, in one statement. */
  takeFlash(id: string, slot: string): Promise<Flash | undefined>;
  /**
   * Makes `charge` the session's open charge unless one is open already, in one statement, and
   * returns the one open now (`undefined` for a session that is gone or not signed in). Two tabs that
   * send at once: the first to arrive is kept, the other's key goes its own way (its tab still shows
   * its outcome through its flash slot).
   */
  openCharge(id: string, charge: OpenCharge): Promise<OpenCharge | undefined>;
  /**
   * Records what the API said of the open charge, with the details of the request it answered, if
   * `charge.key` is still the open one.
   */
  settleCharge(id: string, charge: Required<OpenCharge>): Promise<void>;
  /** Ends the open charge if `key` is still the open one (a page showed its outcome). */
  closeCharge(id: string, key: string): Promise<void>;
  /**
   * Adds a sign-in transaction to a session that is itself a sign-in in progress (no user), keeping
   * the newest {@link maxPendingSignIns}. False when there is no such session (none, expired, or
   * signed in): the caller starts a new one.
   */
  addPending(id: string, pending: PendingSignIn): Promise<boolean>;
  /**
   * Removes the transaction of `state` and returns it, in one statement: single use, so a replayed
   * callback finds nothing. The others stay for their own tabs.
   */
  takePending(id: string | undefined, state: string): Promise<PendingSignIn | undefined>;
  destroy(id: string | undefined): Promise<void>;
  /**
   * Deletes the session, live or ended, and returns what it held, in one statement, so its tokens can
   * be revoked once: of requests that end it at once (a sign-out sent twice, from two tabs or two app
   * processes; a sign-out racing a page that finds it timed out), one gets it. Undefined when none.
   */
  take(id: string | undefined): Promise<SessionData | undefined>;
  /**
   * Deletes a signed-in session that has ended (idle, past its lifetime or its last update's TTL) and
   * returns what it held, in one statement, so its tokens can be revoked once: of two requests that
   * find it ended, one gets it. Undefined for a live session, a sign-in in progress, or none.
   */
  takeEnded(id: string | undefined): Promise<SessionData | undefined>;
}

const stored = ({ state, ...rest }: PendingSignIn): StoredSignIn => ({ stateHash: sha256Id(state), ...rest });

/**
 * {@link SessionData} as the row holds it: its tokens in `sealed` (sealed-tokens.ts), which only the
 * session id opens, in place of `tokens`. A row an earlier version wrote holds `tokens` in clear.
 */
type StoredData = Omit<SessionData, 'tokens'> & { tokens?: SessionTokens; sealed?: unknown };

/** `data` of session `id` as its row is to hold it: its tokens sealed. */
const sealed = (id: string, data: SessionData): StoredData => {
  if (!data.tokens) return data;
  const { tokens, ...rest } = data;
  return { ...rest, sealed: sealTokens(id, sha256Id(id), tokens) };
};

/**
 * The row's `data` of session `id` as the app uses it, and whether its seal failed to open (`broken`:
 * altered, copied from another row). A broken seal is a session that is over: the caller ends it and
 * revokes nothing, having no token to revoke. A seal of a format this version does not know (a later
 * version's, during a rolling deploy) is no tokens here, as a sealed row is to an earlier version:
 * that browser is answered as signed out (its cookie cleared), but the row is not deleted: a process
 * of the later version still reads it (a request that went there first). A row without a seal is an
 * earlier version's, its tokens in clear: used as they are, sealed at its next refresh.
 */
const opened = (id: string, data: StoredData): { data: SessionData; broken: boolean } => {
  const { sealed: seal, ...rest } = data;
  if (seal === undefined) return { data: rest, broken: false };
  const { tokens: _clear, ...withoutTokens } = rest;
  const later = typeof seal === 'object' && seal !== null && (seal as { v?: unknown }).v !== 1;
  if (later) return { data: withoutTokens, broken: false };
  const tokens = openTokens(id, sha256Id(id), seal);
  return tokens ? { data: { ...withoutTokens, tokens }, broken: false } : { data: withoutTokens, broken: true };
};

/** The default of {@link SessionStoreOptions.lifetimeSeconds}: 12 hours. */
const defaultLifetimeSeconds = 12 * 3600;

/**
 * How long a claim on a session's refresh ({@link SessionStore.claimRefresh}) lasts, in seconds. A
 * refresh makes at most three requests to the provider (discovery, the token request, its keys), each
 * given up after 5 seconds (oidc-client.ts): 15 seconds, doubled (30). Computed from those, so a longer
 * provider timeout lengthens the claim too: a claim that ended while its refresh still ran would be
 * taken over, and the two would present one refresh token. A claim held longer is taken to be of a
 * process that died, and is taken over; the longest a dead process keeps a session from refreshing.
 */
export const refreshLeaseSeconds = (2 * providerRequestsPerRefresh * providerTimeoutMs) / 1000;

/** At most this many expired rows are deleted per {@link SessionStore.create}. */
const purgeBatch = 100;

/** What {@link createSessionStore} takes. */
export interface SessionStoreOptions {
  /** How long a session lives after its last update (sign-in, token refresh, form sent), in seconds. */
  ttlSeconds: number;
  /**
   * How long a session lives after its creation, and after its `authTime` (the password), however much
   * it is used (its absolute timeout, OWASP ASVS 3.3.2), in seconds; at least `ttlSeconds`. Default 12
   * hours, or `ttlSeconds` if longer.
   */
  lifetimeSeconds?: number | undefined;
  /**
   * How long a signed-in session lives without a request, reads included (its inactivity timeout,
   * OWASP ASVS 3.3.2 at level 2), in seconds; a whole number, at least {@link seenEverySeconds}.
   * Default 30 minutes.
   */
  idleSeconds?: number | undefined;
}

/** The default of {@link SessionStoreOptions.idleSeconds}: 30 minutes. */
export const defaultIdleSeconds = 30 * 60;

/**
 * A read records the session's use (`last_seen`) only when the last record is older than this, in
 * seconds: an idle limit counted in minutes needs no finer clock, and a page that reads the session
 * several times, or a reader who clicks every few seconds, costs one write a minute, not one a request.
 */
export const seenEverySeconds = 60;

/**
 * Creates a {@link SessionStore}. Ids are 256 random bits; only their hash is stored. A session's
 * tokens are stored sealed with a key derived from its id (sealed-tokens.ts): every method that reads
 * or writes them is given the id, from the browser's cookie, so the row alone (a dump, a replica, a
 * read-only SQL injection) holds no token to present. The purge below reads none: it revokes nothing.
 *
 * A signed-in session ends `idleSeconds` after its last request (a read counts: see
 * {@link seenEverySeconds}), `ttlSeconds` after its last update, and `lifetimeSeconds` after its creation, or
 * after its `authTime` when that is earlier, at the latest: without that limit a session in use, or a
 * stolen cookie replayed every few hours, would never end; and a sign-in that reused the provider's
 * session without the password is no new password. All are measured by the database's clock, the
 * lifetime from `created_at` and `authTime`, which the browser never sees and no request changes, the
 * idle time from `last_seen`. Every read and write treats a session past any of them as
 * gone, and an update extends `expires_at` only up to the end of the lifetime, so the purge below
 * finds those rows too.
 *
 * An expired row is invisible at once and deleted by a later `create`, up to {@link purgeBatch} at a
 * time: every visitor who opens "Sign in" and leaves writes a row, so without that the table would
 * only grow. Each create deletes more rows than it adds, so expired rows never pile up.
 *
 * @example
 * ```ts
 * const sessions = createSessionStore(db, { ttlSeconds: 8 * 3600 });
 * ```
 */
export function createSessionStore(db: Database, options: SessionStoreOptions): SessionStore {
  const seconds = (ttl: number) => Math.max(1, Math.floor(ttl));
  const ttl = seconds(options.ttlSeconds);
  const lifetime = options.lifetimeSeconds ?? Math.max(defaultLifetimeSeconds, ttl);
  if (!Number.isSafeInteger(lifetime) || lifetime < ttl) {
    throw new TypeError('lifetimeSeconds must be a whole number of seconds, at least ttlSeconds');
  }
  const idle = options.idleSeconds ?? defaultIdleSeconds;
  if (!Number.isSafeInteger(idle) || idle < seenEverySeconds) {
    throw new TypeError(`idleSeconds must be a whole number of seconds, at least ${seenEverySeconds}`);
  }
  // A whole number, checked above: written into the statements as it is. `least` ignores a NULL: a row
  // without `authTime` (an earlier version wrote it) ends by its creation alone. `authTime` is the
  // provider's clock, `now()` the database's: seconds apart, against 12 hours.
  const fromPassword = `case when jsonb_typeof(data -> 'authTime') = 'number'
    then to_timestamp((data ->> 'authTime')::float8) + make_interval(secs => ${lifetime}) end`;
  const end = `least(created_at + make_interval(secs => ${lifetime}), ${fromPassword})`;
  // A signed-in session's last request: `last_seen`, or its last change when that is later. A row an
  // earlier version wrote has no `last_seen` (NULL, which `greatest` ignores), and a process of that
  // version still serving during a rolling deploy changes rows without setting it: their last change
  // is `expires_at - ttl` (exactly, until the lifetime caps `expires_at`; the earliest it can be after
  // that), so they end `idle` after it as they would have here. A sign-in in progress (no `user`) has a
  // life of its own, shorter, and nothing to read in between: the idle limit is not its.
  const seen = `greatest(last_seen, expires_at - make_interval(secs => ${ttl}))`;
  const active = `(not (data ? 'user') or ${seen} > now() - make_interval(secs => ${idle}))`;
  const live = `expires_at > now() and ${end} > now() and ${active}`;
  const extended = (param: string) => `least(now() + make_interval(secs => ${param}::int), ${end})`;
  /**
   * {@link SessionStore.finishRefresh}: only while the session's refresh is claimed by `claim`, and the
   * claim ends. The number of rows changed.
   */
  const change = async (id: string, changes: Partial<SessionData>, claim: string) => {
    const removed = Object.keys(changes).filter((key) => changes[key as keyof SessionData] === undefined);
    let set: Partial<StoredData> = changes;
    if ('tokens' in changes) {
      // New tokens replace the seal, and the clear ones of a row an earlier version wrote go with it.
      const { tokens, ...rest } = changes;
      set = tokens ? { ...rest, sealed: sealTokens(id, sha256Id(id), tokens) } : rest;
      removed.push('tokens', ...(tokens ? [] : ['sealed']));
    }
    // JSON.stringify drops the undefined fields: `set` holds only the ones given a value.
    const { rowCount } = await db.query(
      `update app_sessions set data = (data - $3::text[]) || $2::jsonb,
         expires_at = ${extended('$4')}, last_seen = now(), refreshing_until = null, refreshing_by = null
       where id_hash = $1 and ${live} and data ? 'user' and refreshing_by = $5`,
      [sha256Id(id), JSON.stringify(set), removed, ttl, claim],
    );
    return rowCount;
  };
  /**
   * The session `id`'s row `data` as the app uses it; undefined when its seal does not open, after
   * deleting the row if it still holds that seal: a session that is over (never a 500), whose cookie
   * then goes as a signed-out one does. Nothing is revoked: there is no token to revoke.
   */
  const usable = async (id: string, data: StoredData | undefined): Promise<SessionData | undefined> => {
    if (data === undefined) return undefined;
    const { data: open, broken } = opened(id, data);
    if (!broken) return open;
    await db.query(`delete from app_sessions where id_hash = $1 and data -> 'sealed' = $2::jsonb`, [
      sha256Id(id),
      JSON.stringify(data.sealed),
    ]);
    return undefined;
  };
  return {
    async create(data, ttlSeconds = ttl) {
      await db.query(
        `delete from app_sessions where id_hash in (
           select id_hash from app_sessions where expires_at <= now() order by expires_at limit $1
         )`,
        [purgeBatch],
      );
      const id = randomBytes(32).toString('base64url');
      const row = sealed(id, data.pending ? { ...data, pending: data.pending.map(stored) } : (data as SessionData));
      await db.query(
        `insert into app_sessions (id_hash, data, created_at, last_seen, expires_at)
         values ($1, $2, now(), now(), least(
           now() + make_interval(secs => least($3::int, $4::int)),
           to_timestamp($5::float8) + make_interval(secs => $4::int)
         ))`,
        [
          sha256Id(id),
          JSON.stringify(row),
          seconds(ttlSeconds),
          lifetime,
          typeof data.authTime === 'number' && Number.isFinite(data.authTime) ? data.authTime : null,
        ],
      );
      return id;
    },
    async get(id) {
      if (!id) return undefined;
      // A read is a use: recorded in the same statement (a statement in `with` runs whether the
      // query reads it or not), and only when the last record is over a minute old, so reads cost a
      // write a minute at most. Both parts see the row as it was: the session idle until now is not
      // brought back by this very request.
      const { rows } = await db.query<{ data: StoredData }>(
        `with seen as (
           update app_sessions set last_seen = now()
            where id_hash = $1 and ${live} and data ? 'user'
              and (last_seen is null or last_seen < now() - make_interval(secs => ${seenEverySeconds}))
         )
         select data from app_sessions where id_hash = $1 and ${live}`,
        [sha256Id(id)],
      );
      return usable(id, rows[0]?.data);
    },
    async claimRefresh(id, claim) {
      // Under READ COMMITTED a second claim sent at once waits for the first's row lock, then checks
      // its condition again on the row the first left: claimed, so it claims nothing.
      const { rows } = await db.query<{ data: StoredData }>(
        `update app_sessions
            set refreshing_until = now() + make_interval(secs => ${refreshLeaseSeconds}), refreshing_by = $2
          where id_hash = $1 and ${live} and data ? 'user'
            and (refreshing_until is null or refreshing_until <= now())
          returning data`,
        [sha256Id(id), claim],
      );
      return usable(id, rows[0]?.data);
    },
    async finishRefresh(id, claim, changes) {
      // Still ours even past its time, unless another took it over: that one presents the same
      // refresh token (the provider answers it, or revokes the grant), and its tokens are the ones kept.
      return (await change(id, changes, claim)) > 0;
    },
    async releaseRefresh(id, claim) {
      await db.query(
        'update app_sessions set refreshing_until = null, refreshing_by = null where id_hash = $1 and refreshing_by = $2',
        [sha256Id(id), claim],
      );
    },
    async setFlash(id, slot, flash) {
      // One statement on the row as it is now: a slot another tab set meanwhile stays.
      await db.query(
        `update app_sessions
            set data = jsonb_set(data, '{flashes}', coalesce(data -> 'flashes', '{}'::jsonb) || jsonb_build_object($2::text, $3::jsonb)),
                expires_at = ${extended('$4')}, last_seen = now()
          where id_hash = $1 and ${live} and data ? 'user'`,
        [sha256Id(id), slot, JSON.stringify(flash), ttl],
      );
    },
    async takeFlash(id, slot) {
      // The row is locked between reading the slot and removing it: nobody takes it twice.
      const { rows } = await db.query<{ flash: Flash }>(
        `with shown as (
           select id_hash, data -> 'flashes' -> $2::text as flash from app_sessions
           where id_hash = $1 and ${live} and data -> 'flashes' -> $2::text is not null
           for update
         )
         update app_sessions set data = jsonb_set(app_sessions.data, '{flashes}', (app_sessions.data -> 'flashes') - $2::text)
           from shown
         where app_sessions.id_hash = shown.id_hash
         returning shown.flash`,
        [sha256Id(id), slot],
      );
      return rows[0]?.flash ?? undefined;
    },
    async openCharge(id, charge) {
      // The row as it is when locked: of two tabs sending at once, one opens, the other reads it.
      const { rows } = await db.query<{ open: OpenCharge | null }>(
        `update app_sessions
            set data = case when data ? 'openCharge' then data else jsonb_set(data, '{openCharge}', $2::jsonb) end
          where id_hash = $1 and ${live} and data ? 'user'
          returning data -> 'openCharge' as open`,
        [sha256Id(id), JSON.stringify(charge)],
      );
      return rows[0]?.open ?? undefined;
    },
    async settleCharge(id, charge) {
      await db.query(
        `update app_sessions set data = jsonb_set(data, '{openCharge}', $3::jsonb)
          where id_hash = $1 and ${live} and data -> 'openCharge' ->> 'key' = $2`,
        [sha256Id(id), charge.key, JSON.stringify(charge)],
      );
    },
    async closeCharge(id, key) {
      await db.query(
        `update app_sessions set data = data - 'openCharge'
          where id_hash = $1 and ${live} and data -> 'openCharge' ->> 'key' = $2`,
        [sha256Id(id), key],
      );
    },
    async addPending(id, pending) {
      const { rows } = await db.query(
        `update app_sessions
            set data = jsonb_set(data, '{pending}', (
              select coalesce(jsonb_agg(entry order by n), '[]'::jsonb) from (
                select entry, n from jsonb_array_elements(coalesce(data -> 'pending', '[]'::jsonb) || jsonb_build_array($2::jsonb))
                  with ordinality as t(entry, n)
                order by n desc limit $3
              ) newest
            ))
          where id_hash = $1 and ${live} and not (data ? 'user')
            and jsonb_typeof(data -> 'pending') = 'array'
          returning 1`,
        [sha256Id(id), JSON.stringify(stored(pending)), maxPendingSignIns],
      );
      return rows.length > 0;
    },
    async takePending(id, state) {
      if (!id) return undefined;
      const { rows: found } = await db.query<{ data: SessionData }>(
        `select data from app_sessions where id_hash = $1 and ${live}`,
        [sha256Id(id)],
      );
      const list = found[0]?.data.pending;
      const stateHash = sha256Id(state);
      const entry = Array.isArray(list) ? list.find((other) => other.stateHash === stateHash) : undefined;
      if (!entry) return undefined;
      // Removed only if still there (the condition is checked again on the row as it is when locked):
      // of two callbacks with one state, one gets the transaction, the other nothing. `is distinct
      // from`, not `<>`: an entry an earlier-version process added during a rolling deploy has no
      // stateHash (NULL), and is kept for the next start's rewrite (schema.ts), not dropped.
      const { rows } = await db.query(
        `update app_sessions set data = jsonb_set(data, '{pending}', (
             select coalesce(jsonb_agg(other), '[]'::jsonb)
               from jsonb_array_elements(data -> 'pending') other where other ->> 'stateHash' is distinct from $2
           ))
          where id_hash = $1 and ${live} and jsonb_typeof(data -> 'pending') = 'array'
            and data -> 'pending' @> jsonb_build_array(jsonb_build_object('stateHash', $2::text))
          returning 1`,
        [sha256Id(id), stateHash],
      );
      if (rows.length === 0) return undefined;
      const { stateHash: _hash, ...rest } = entry;
      return { state, ...rest };
    },
    async destroy(id) {
      if (!id) return;
      await db.query('delete from app_sessions where id_hash = $1', [sha256Id(id)]);
    },
    async take(id) {
      if (!id) return undefined;
      const { rows } = await db.query<{ data: StoredData }>(
        'delete from app_sessions where id_hash = $1 returning data',
        [sha256Id(id)],
      );
      // A seal that does not open gives no tokens: the caller revokes nothing, with nothing made up.
      return rows[0] && opened(id, rows[0].data).data;
    },
    async takeEnded(id) {
      if (!id) return undefined;
      const { rows } = await db.query<{ data: StoredData }>(
        `delete from app_sessions where id_hash = $1 and data ? 'user' and not (${live}) returning data`,
        [sha256Id(id)],
      );
      return rows[0] && opened(id, rows[0].data).data;
    },
  };
}
