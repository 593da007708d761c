import { randomUUID } from 'node:crypto';
import * as oauth from 'oauth4webapi';
import type { OidcClient } from './oidc-client.js';
import { type ReportedError, withoutToken } from './reported-error.js';
import {
  refreshLeaseSeconds,
  type SessionData,
  type SessionStore,
  type SessionTokens,
  type SignedInUser,
} from './sessions.js';

/**
 * The OAuth error code of a refused token request (RFC 6749 5.2), or undefined when the provider did
 * not answer with one (unreachable, a 5xx, an answer that is no OAuth error). From the JSON body, or
 * from a `WWW-Authenticate` challenge: oauth4webapi reads the challenge first, and oidc-provider
 * sends one (`Basic`) with a 401 `invalid_client`. Only the shape of a code is taken from a challenge.
 */
function refusalCode(error: unknown): string | undefined {
  if (error instanceof oauth.ResponseBodyError) return error.error;
  if (error instanceof oauth.WWWAuthenticateChallengeError) {
    const code = error.cause.find((challenge) => challenge.parameters.error !== undefined)?.parameters.error;
    return code !== undefined && /^[a-z_]{1,64}$/.test(code) ? code : undefined;
  }
  return undefined;
}

/** What a refresh stores in the session: the new tokens, and the user when a new ID token came. */
type RefreshChanges = { tokens: SessionTokens; user?: SignedInUser };

/**
 * Tokens the provider issued that the database would not store, held by the process that asked for
 * them, with the claim on the session's refresh they were issued under (kept, not released).
 */
interface UnstoredRefresh {
  claim: string;
  changes: RefreshChanges;
  /** When a request last used them (the real clock, `clock`, ms): an entry untouched past the idle limit goes. */
  touched: number;
  /**
   * Their refresh token is being presented to the provider (a refresh under their claim is under way):
   * they are not offered to the database meanwhile. Stored, they would end the claim, and the tokens
   * that refresh brings back would find none to be stored under: the row would keep the refresh token
   * just spent.
   */
  presenting?: boolean;
}

/**
 * The pauses before each retry of a refresh's store (ms): three attempts in about a third of a second,
 * enough for a pool timeout or a failover's blip, short against the page the person waits for.
 */
const storePausesMs = [50, 250];

/**
 * What one request of the browser (a page load, a form) has seen of its session's refreshes, shared
 * by everything it does: the page's parallel reads, each read's forced refresh after a 401, a charge's
 * retries. Once a refresh it started or joined failed (the provider refused it or could not be
 * reached, or this request waited out another process's claim), the request asks for no other: the same
 * refresh token would meet the same answer, and a page of five reads would ask the provider five times.
 */
export interface RefreshTurn {
  failed: boolean;
}

/** How a refresh ended, for those who started or joined it: `failed` when no new tokens could be had. */
interface RefreshOutcome {
  failed: boolean;
}

/** What {@link createRefresher} needs. */
export interface RefresherOptions {
  sessions: SessionStore;
  oidc: Pick<OidcClient, 'refresh'>;
  /** Epoch milliseconds, the app's clock: how old a token is. */
  now: () => number;
  /** Refresh this long before the access token expires (ms). */
  refreshMargin: number;
  /** Tokens held unstored and untouched this long (ms) are of a session that has ended (idle). */
  unstoredForMs: number;
  /**
   * The real clock (epoch ms), for how long held tokens went untouched and how long a request waits for
   * another process's refresh: not `now`, which tests move to age tokens. Default `Date.now`.
   */
  clock?: (() => number) | undefined;
  /**
   * Waits `ms` on that clock: between the reads of a session whose refresh another process holds, and
   * between the tries to store a refresh's tokens. Default a real timer; tests inject it with `clock`
   * to reach the give-up without waiting.
   */
  sleep?: ((ms: number) => Promise<void>) | undefined;
  /** Told a refusal of the provider that says nothing of the grant (see `refresh-refused` in events.ts). */
  onRefused: (error: ReportedError) => void;
  /**
   * Revokes tokens the provider issued to another user than the session's, as sign-out revokes its
   * own; a failure is reported as `during: 'refresh'` (see `revocation-failed` in events.ts).
   */
  revoke: (tokens: SessionTokens) => Promise<unknown>;
}

/** The refresh of the third-party app's sessions, made by {@link createRefresher}. */
export interface Refresher {
  /**
   * Session `id` as read (`data`, signed in), with the tokens this process holds for it unstored, and
   * refreshed when its access token is about to expire. Undefined when the session is over.
   */
  fresh(id: string, data: SessionData, turn?: RefreshTurn): Promise<SessionData | undefined>;
  /**
   * A new access token for session `id`, whose token `refused` the API refused (401 invalid_token)
   * while the session holds it still. Undefined when no other token can be had.
   */
  replaceRefused(id: string, refused: string, turn?: RefreshTurn): Promise<string | undefined>;
  /** Drops what this process holds for session `id` (it ended: signed out, replaced, timed out). */
  forget(id: string): void;
  /** How many sessions' tokens this process holds unstored: a figure of health, zero in a good day. */
  held(): number;
}

/**
 * Refreshes the sessions' tokens: one refresh of a session at a time in this process (joined by the
 * requests that find one under way) and across processes (a claim on the session's row); tokens the
 * database would not store are held here under their claim until it takes them.
 *
 * @example
 * ```ts
 * const refresher = createRefresher({ sessions, oidc, now, refreshMargin: 30_000, unstoredForMs, onRefused, revoke });
 * const data = await refresher.fresh(id, await sessions.get(id));
 * ```
 */
export function createRefresher(options: RefresherOptions): Refresher {
  const { sessions, oidc, now, refreshMargin, unstoredForMs } = options;
  const clock = options.clock ?? Date.now;
  const sleep = options.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
  const refreshing = new Map<string, { pending: Promise<SessionData | undefined>; outcome: RefreshOutcome }>();
  const unstored = new Map<string, UnstoredRefresh>();

  /**
   * The refresh of session `id` in flight, joined, or a new one: one at a time per session in this
   * process, so that two requests never present the same refresh token (the provider would take the
   * second for reuse and revoke the grant). Across processes, {@link refreshSession} claims it on the
   * session's row; this map spares the requests of one process that claim's waiting and reading.
   * `joined` says it was started by another request; `outcome.failed`, once it is settled, that it
   * brought no new tokens because none could be had (see {@link RefreshOutcome}).
   */
  const refreshOnce = (id: string, refused?: string) => {
    const inFlight = refreshing.get(id);
    if (inFlight) return { ...inFlight, joined: true };
    const outcome: RefreshOutcome = { failed: false };
    const pending = refreshSession(id, outcome, refused).finally(() => refreshing.delete(id));
    refreshing.set(id, { pending, outcome });
    return { pending, outcome, joined: false };
  };

  /** Whether `tokens` are to be refreshed: about to expire, or, given `refused`, still that refused token. */
  const due = (tokens: SessionTokens, refused: string | undefined) =>
    refused === undefined ? tokens.expiresAt - refreshMargin <= now() : tokens.accessToken === refused;

  /**
   * Refreshes session `id`: when its access token is about to expire, or, given `refused`, when it
   * still holds that token the API refused. Undefined when the session is over.
   *
   * One refresh of a session at a time across every app process on the database, not only this one
   * (the map above): the refresh is claimed on the session's row first (`claimRefresh`, sessions.ts).
   * A request that finds it claimed waits, reading the session again, until the other refresh has
   * stored its tokens, and takes them: it spends nothing. Two processes presenting one refresh token
   * would look like reuse to the provider, which then revokes the grant (signed out everywhere).
   */
  const refreshSession = async (
    id: string,
    outcome: RefreshOutcome,
    refused?: string,
  ): Promise<SessionData | undefined> => {
    const claim = randomUUID();
    // The real clock (`clock`), not `now`: how long this request waits, not how old a token is. A claim
    // ends with its time (a process that died), and is taken over then; this bounds the wait all the same.
    const giveUp = clock() + (refreshLeaseSeconds + 5) * 1000;
    for (let pause = 20; ; pause = Math.min(pause * 2, 250)) {
      // Read again each turn: another request (here or in another process) may have refreshed since.
      // Its refresh token is used up: presenting it again would look like reuse to the provider.
      const read = await sessions.get(id);
      const data = read?.tokens && read.user ? await withUnstored(id, read) : undefined;
      if (!data?.tokens || !data.user) return undefined;
      if (!due(data.tokens, refused)) return data;
      // Tokens this process holds and could not store: their refresh token is the live one, and the
      // claim they were issued under is still this process's, so they are refreshed under it.
      const held = unstored.get(id);
      if (held) return refreshClaimed(id, held.claim, data, refused, outcome);
      if (!data.tokens.refreshToken) {
        // A token the API refused ends nothing: the session lasts its own time, the call fails.
        if (refused !== undefined) return data;
        await sessions.destroy(id);
        return undefined;
      }
      const claimed = await sessions.claimRefresh(id, claim);
      if (claimed) return refreshClaimed(id, claim, claimed, refused, outcome);
      if (clock() >= giveUp) {
        outcome.failed = true;
        return data;
      }
      await sleep(pause);
    }
  };

  /**
   * Stores a refresh's tokens under its claim ({@link SessionStore.finishRefresh}), sent again after a
   * short pause when the database fails (a blip, a pool timeout): the provider has rotated the refresh
   * token already, so giving up loses the only live one. A retry is safe: the statement writes only
   * while `claim` is the session's, and ends it, so a second run after a first that did write (its
   * answer lost) writes nothing and says false. Throws the last error when every attempt failed.
   */
  const storeRefreshed = async (id: string, claim: string, changes: RefreshChanges): Promise<boolean> => {
    for (let attempt = 0; ; attempt++) {
      try {
        return await sessions.finishRefresh(id, claim, changes);
      } catch (error) {
        const pause = storePausesMs[attempt];
        if (pause === undefined) throw error;
        await sleep(pause);
      }
    }
  };

  /**
   * Session `id` as read (`data`), with the tokens this process holds for it unstored, if any (see
   * {@link refreshClaimed}): they are offered to the database again first. Stored, the claim ends and
   * the entry goes; refused (the claim was taken over after its time, or the session ended), the
   * entry goes and the session is as the database has it now; failed again, the held tokens are the
   * session's for this request, and the claim stays.
   */
  const withUnstored = async (id: string, data: SessionData): Promise<SessionData | undefined> => {
    sweep(id);
    const held = unstored.get(id);
    if (!held) return data;
    if (held.presenting) return { ...data, ...held.changes };
    let stored: boolean;
    try {
      stored = await sessions.finishRefresh(id, held.claim, held.changes);
    } catch {
      held.touched = clock();
      return { ...data, ...held.changes };
    }
    if (unstored.get(id) === held) unstored.delete(id);
    return stored ? { ...data, ...held.changes } : await sessions.get(id);
  };

  /**
   * Drops the entries untouched for `unstoredForMs`, but `id`'s (its session was just read live): each
   * is of a session that ended by its idle time at the database, whose browser never came back to tell
   * this process. Run at every read of a session, not only when an entry is added: a process that
   * holds one entry would keep it for good. Not an entry whose refresh token is being presented.
   */
  const sweep = (id: string) => {
    if (unstored.size === 0) return;
    const at = clock();
    for (const [other, entry] of unstored)
      if (other !== id && !entry.presenting && at - entry.touched > unstoredForMs) unstored.delete(other);
  };

  /** Keeps `changes`, issued under `claim`, for {@link withUnstored}; drops entries of ended sessions. */
  const keepUnstored = (id: string, claim: string, changes: RefreshChanges) => {
    sweep(id);
    unstored.set(id, { claim, changes, touched: clock() });
  };

  /**
   * The refresh itself, once `claim` holds it. The claim ends when the tokens are stored, and in any
   * case before this returns (a crash in between leaves it to end with its time), except when the
   * tokens could not be stored.
   *
   * Then the provider has rotated the refresh token and the session's row still holds the spent one:
   * whoever presents that one next looks like reuse to the provider, which revokes the grant (signed
   * out everywhere). So the claim is kept, not released: no request of any process presents the spent
   * token while it lasts (30 seconds), as they wait for a refresh they take to be under way. This
   * request goes on with the new tokens, and this process keeps them ({@link unstored}) for its next
   * requests of the session, which offer them to the database again before anything else: the first
   * one it takes ends the claim. Past the claim's time, another process may take it over and present
   * the spent token; only the provider's reuse interval saves the grant then.
   */
  const refreshClaimed = async (
    id: string,
    claim: string,
    data: SessionData,
    refused: string | undefined,
    outcome: RefreshOutcome,
  ): Promise<SessionData | undefined> => {
    let stored = false;
    let presenting: UnstoredRefresh | undefined;
    try {
      // The row as it was claimed: a refresh that ended between the read and the claim stored new tokens.
      const refreshToken = data.tokens?.refreshToken;
      if (!data.tokens || !data.user || !refreshToken || !due(data.tokens, refused)) return data;
      // Tokens held unstored under this claim: not offered to the database while their refresh token
      // is spent (see UnstoredRefresh.presenting); this refresh's own tokens replace them.
      presenting = unstored.get(id)?.claim === claim ? unstored.get(id) : undefined;
      if (presenting) presenting.presenting = true;
      let result: Awaited<ReturnType<typeof oidc.refresh>>;
      try {
        result = await oidc.refresh(refreshToken);
      } catch (error) {
        const code = refusalCode(error);
        if (code === 'invalid_grant') {
          // The refresh token was revoked, reused or expired (RFC 6749 5.2): the session is over.
          unstored.delete(id);
          await sessions.destroy(id);
          return undefined;
        }
        // Any other refusal speaks of the client (invalid_client: a client secret rotated at the
        // provider only) or of the moment, not of this grant: ending the session would sign every user
        // out. It is kept, with the refresh token unspent, as when the provider cannot be reached; the
        // claim goes (below), the API says if the old access token expired, and the next request that
        // finds it due asks the provider once more: one attempt per request, never a loop.
        if (code !== undefined) {
          const reported = withoutToken(error, refreshToken);
          // A challenge's code is not on the error itself; its shape was checked (no token in it).
          reported.error ??= code;
          options.onRefused(reported);
        }
        outcome.failed = true;
        return data;
      }
      // OIDC Core 12.2: an ID token from a refresh names the same user. One that names another is no
      // refresh of this session: it ends, and the tokens just issued are revoked.
      if (result.user !== undefined && result.user.sub !== data.user.sub) {
        unstored.delete(id);
        await sessions.destroy(id);
        await options.revoke({ ...result.tokens, refreshToken: result.tokens.refreshToken ?? refreshToken });
        return undefined;
      }
      const tokens = { ...result.tokens, refreshToken: result.tokens.refreshToken ?? refreshToken };
      // Only the tokens (and the user, when the provider sent a new ID token): a flash set meanwhile stays.
      const changes: RefreshChanges = { tokens, ...(result.user ? { user: result.user } : {}) };
      try {
        stored = await storeRefreshed(id, claim, changes);
      } catch {
        // The database would not take them: kept here, the claim kept (see above).
        keepUnstored(id, claim, changes);
        return { ...data, ...changes };
      }
      // Stored, or held no more: the claim was taken over after its time (that refresh's tokens are
      // the session's), or the session ended meanwhile. The session as it is now, then.
      if (unstored.get(id)?.claim === claim) unstored.delete(id);
      return stored ? { ...data, ...changes } : await sessions.get(id);
    } finally {
      // Held tokens still held (the provider could not be reached) are offered to the database again.
      if (presenting) presenting.presenting = false;
      // A failed release leaves the claim to end with its time. Tokens held unstored keep theirs.
      if (!stored && unstored.get(id)?.claim !== claim) await sessions.releaseRefresh(id, claim).catch(() => undefined);
    }
  };

  /**
   * A new access token for session `id`, whose token `refused` the API refused (401 invalid_token:
   * revoked, of a retired key, expired by the API's clock) while the session holds it for valid.
   */
  const replaceRefused = async (id: string, refused: string, turn?: RefreshTurn): Promise<string | undefined> => {
    // This request saw a refresh fail already (the page's own, or one another read of it joined).
    if (turn?.failed) return undefined;
    // A refresh this one joins may have been one for an expiring token that found it fresh, and kept
    // the refused one: then this request starts its own, once. Not after one that asked the provider
    // and failed: the same refresh token with the same client secret would fail the same way.
    for (let tries = 0; tries < 2; tries++) {
      const { pending, joined, outcome } = refreshOnce(id, refused);
      const token = (await pending)?.tokens?.accessToken;
      if (token !== refused) return token;
      if (outcome.failed) {
        if (turn) turn.failed = true;
        return undefined;
      }
      if (!joined) break;
    }
    return undefined;
  };

  return {
    async fresh(id, data, turn) {
      const current = await withUnstored(id, data);
      if (!current?.tokens) return undefined;
      if (current.tokens.expiresAt - refreshMargin > now()) return current;
      // Due, and this request saw a refresh fail already: it goes on with the tokens it has, as after
      // that failure; its next request asks again.
      if (turn?.failed) return current;
      const { pending, outcome } = refreshOnce(id);
      const fresh = await pending;
      if (outcome.failed && turn) turn.failed = true;
      return fresh;
    },
    replaceRefused,
    forget: (id) => {
      unstored.delete(id);
    },
    held: () => unstored.size,
  };
}
