import { randomUUID } from 'node:crypto';
import { type ClientOptions, createClient, isRequestFailedError, saysTokenInvalid } from '@idem/client';
import { notify } from '@idem/core';
import express, { type Express, type Request, type Response } from 'express';
import * as oauth from 'oauth4webapi';
import { clientErrorStatus } from '../client-error.js';
import { readCookie, serializeCookie } from '../cookies.js';
import { createCsrf } from '../csrf.js';
import type { Database } from '../db.js';
import { dbUnavailable, storeRetryAfterSeconds } from '../db-unavailable.js';
import { errorPage, pageHeaders } from '../html.js';
import { loadCsrfKey } from '../idp/secrets.js';
import { methodNotAllowed } from '../methods.js';
import { type ApiRequest, type ApiResult, callApi } from './api-client.js';
import { createOidcClient } from './oidc-client.js';
import {
  appErrorPage,
  chargeCreatedPage,
  chargeOutcomeUnknownPage,
  homePage,
  signedOutPage,
  signInAgainPage,
  signInFailedPage,
  themeOutcomeUnknownPage,
} from './pages.js';
import { createRefresher, type RefresherOptions, type RefreshTurn } from './refresh.js';
import { refusalLogger } from './refusal-log.js';
import { type ReportedError, withoutToken } from './reported-error.js';
import {
  createSessionStore,
  defaultIdleSeconds,
  type Flash,
  type SessionData,
  type SessionTokens,
  seenEverySeconds,
} from './sessions.js';

/**
 * The scopes the third-party app asks for: only what it uses (spec 5.7). It lists photos, reads stock
 * levels, reads and sets the theme, and creates charges; it never adds or deletes a photo, and never
 * acts with the user's admin role (`stock:write`, `events:*`).
 */
export const appScope =
  'openid profile email offline_access photos:read stock:read charges:write settings:read settings:write';

/**
 * How long the app's session lives after the password (the ID token's `auth_time`), however much it
 * is used: 12 hours, OWASP ASVS 3.3.2 at level 2. `startReferenceApp` has the provider end the app's
 * refresh tokens then too.
 */
export const appSessionLifetimeSeconds = 12 * 3600;

/** What {@link createThirdPartyApp} needs. */
export interface ThirdPartyAppOptions {
  db: Database;
  /** The identity provider's issuer. */
  issuer: string;
  clientId: string;
  clientSecret: string;
  /** The app's own public URL; the callback is `<appUrl>/callback`. */
  appUrl: string;
  /** The API through the gateway ({base_url}). */
  baseUrl: string;
  /** The resource indicator to ask tokens for; the base URL by default. */
  resource?: string | undefined;
  /** Epoch milliseconds; injected so tests can age tokens without waiting. */
  now?: (() => number) | undefined;
  /** Items whose stock the page shows. */
  stockItems?: readonly string[] | undefined;
  /** Refresh this long before the access token expires (ms); default 30 s. */
  refreshMargin?: number | undefined;
  /**
   * How "Create charge" waits between retries and draws its jitter (default: real timers and
   * `Math.random`); tests inject both to check the backoff without waiting for it.
   */
  retryTiming?: Pick<ClientOptions, 'sleep' | 'random'> | undefined;
  /**
   * The real clock (epoch ms) and the pause of the refresher's waits: how long a request waits for
   * another process's refresh of its session (the claim's time and 5 s), and the pauses between tries
   * to store a refresh's tokens (default: `Date.now` and real timers). Not `now`, which ages tokens and
   * which tests move by minutes; tests inject both to reach a give-up without waiting for it.
   */
  refreshTiming?: Pick<RefresherOptions, 'clock' | 'sleep'> | undefined;
  /**
   * Told what went wrong out of the user's sight: a revocation the provider did not confirm, whose
   * token stays valid until it expires; a refresh the provider refused for another reason than the
   * grant (a client secret rotated at the provider only). Default: a line on stderr, without the token;
   * refused refreshes counted, at most one line a minute (the last count at shutdown: see
   * {@link ThirdPartyApp.flushLog}).
   */
  onEvent?: ((event: ThirdPartyAppEvent) => void) | undefined;
  /**
   * How long a signed-in session lives without a request from the browser, reads included, in
   * seconds: 30 minutes (1800) by default, OWASP ASVS 3.3.2 at level 2. A whole number, at least 60;
   * anything else is a `TypeError`.
   */
  sessionIdleSeconds?: number | undefined;
}

/**
 * What the third-party app reports through {@link ThirdPartyAppOptions.onEvent}:
 * - `revocation-failed`: a token of a session that ended (replaced by a new sign-in, signed out, or
 *   timed out: idle, or 12 hours after the password, found so by the browser's next request), of a
 *   sign-in whose session the database failed to store (`during: 'sign-in'`), or of a refresh whose ID
 *   token named another user than the session's (`during: 'refresh'`: the session ends, and the tokens
 *   that refresh brought are revoked), could not be revoked (RFC 7009): the provider could not be
 *   reached or refused. The session is gone here all the same; the token works at the provider until
 *   it expires.
 * - `refresh-refused`: the provider refused a refresh with an OAuth error other than `invalid_grant`
 *   (RFC 6749 5.2), which says nothing of the grant: `invalid_client` (the app's client secret is not
 *   the provider's: rotated at one and not yet at the other), `unauthorized_client`, `invalid_scope`,
 *   `invalid_request`, a 429. The session is kept with the tokens it has, and its next request that
 *   finds the access token due asks again. Reported at each attempt: a wrong client secret refuses every
 *   session's refresh, and the operator is the one to fix it. (`invalid_grant` ends the session, the
 *   user's business, and is not reported; nor is a provider that cannot be reached, or answers 5xx.)
 *   The default report counts them: the first line at once, then at most one a minute with how many
 *   of each code came in, not a line per request.
 */
export type ThirdPartyAppEvent =
  | {
      type: 'revocation-failed';
      during: 'sign-in' | 'sign-out' | 'timeout' | 'refresh';
      tokenType: 'refresh_token' | 'access_token';
      /**
       * What went wrong, as a plain Error: the network's or the provider's message, with its OAuth `error`
       * code, HTTP `status` and network `code` where there is one; never the token (see withoutToken).
       */
      error: ReportedError;
    }
  | {
      type: 'refresh-refused';
      /** The provider's refusal, as a plain Error with its OAuth `error` code and HTTP `status`; never the token. */
      error: ReportedError;
    };

/**
 * The default of {@link ThirdPartyAppOptions.onEvent}: a line on stderr. A revocation that failed, one
 * line each; refused refreshes counted (see {@link refusalLogger}): the first at once, then at most
 * one line a minute, by the app's clock `now`.
 */
function eventLogger(now: () => number): { onEvent: (event: ThirdPartyAppEvent) => void; flush: () => void } {
  const refusals = refusalLogger({ write: (line) => console.warn(line), now });
  const onEvent = (event: ThirdPartyAppEvent) => {
    if (event.type === 'refresh-refused') {
      refusals.note(event.error);
      return;
    }
    const reason = event.error instanceof Error ? event.error.message : String(event.error);
    const cause = event.during === 'refresh' ? 'a refresh that named another user' : event.during;
    console.warn(
      `third-party app: the ${event.tokenType} of a session ended by ${cause} could not be revoked (${reason}); it stays valid until it expires`,
    );
  };
  return { onEvent, flush: refusals.flush };
}

/** The third-party app, an Express app. */
export interface ThirdPartyApp {
  readonly app: Express;
  /**
   * Writes the line of refused refreshes the default report (no `onEvent`) counted since its last
   * one, if any, and stops its timer. For a shutdown, once the app's port is closed: the refusals of
   * its last minute would otherwise never be told. Nothing to do with an `onEvent` of one's own.
   */
  flushLog(): void;
}

/**
 * The app's cookie names. Over https they carry the `__Host-` prefix: browsers then take such a cookie
 * only from this very origin, `Secure`, with `Path=/` and no `Domain`, so a sibling subdomain cannot
 * plant one (cookie tossing) ahead of ours. Over plain http (the local demo) browsers refuse the
 * prefix, and the names are bare.
 *
 * @example
 * ```ts
 * cookieNames(true); // { session: '__Host-app_session', csrf: '__Host-app_csrf' }
 * ```
 */
export function cookieNames(secure: boolean) {
  const prefix = secure ? '__Host-' : '';
  return { session: `${prefix}app_session`, csrf: `${prefix}app_csrf` };
}

/**
 * How long a sign-in in progress (a session with only its transaction) lives. The provider's login
 * step expires sooner; a visitor who opens "Sign in" and leaves must not hold a row for 8 hours.
 */
const pendingTtlSeconds = 15 * 60;

// The `state` the provider's logout hands back to the app's root: the sign-out went through.
const signedOutState = 'signed-out';

// The `state` of the app's root after a form that came with no live session (it expired, its grant was
// revoked, or another tab signed out): the person asked for something, a charge say, and must not be
// left to wonder whether it went through.
const formUnsentState = 'form-not-sent';

/** What the signed-out page says for the `state` the app's root was sent to; anyone can link there. */
const signedOutNotices: Record<string, string> = {
  [signedOutState]: 'You are signed out.',
  [formUnsentState]: 'Your session ended before this form arrived: nothing was done. Sign in to go on.',
};

/**
 * What a POST /charges knows of its charge, as it goes: what the 503 page of a database that fails
 * next says (see {@link storeUnavailablePage}). Each step is noted before the route's next database
 * statement, and replaces the one before it. Keyed by the request, so it goes with it.
 * - `sending`: a runnable charge about to go out, with the session's CSRF token for a form that sends
 *   it again under its key (only once it went out does the page offer it).
 * - `created`: the API answered 2xx on this request (created, or its stored 201 replayed).
 * - `refused`: the API refused it on every attempt (a 4xx each time: nothing ran, as the route's
 *   `mayHaveRun` says), with the last status.
 * - `key-taken`: the API refused it because its key stands for another charge (`fingerprint_mismatch`,
 *   `idempotency_error`): nothing ran for this one, and the same key would be refused again.
 */
type ChargeSoFar =
  | { step: 'sending'; key: string; amount: number; currency: string; csrf: string }
  | { step: 'created'; key: string; amount: number; currency: string }
  | { step: 'refused'; status: number }
  | { step: 'key-taken'; status: number; code: string };
const chargeSoFar = new WeakMap<Request, ChargeSoFar>();

/**
 * The theme each POST /theme is about to set, with the session's CSRF token: what the 503 page of a
 * database that failed after it went out offers again (PUT /settings replaces the whole document, so
 * sending it twice is safe; see {@link storeUnavailablePage}). Keyed by the request, so it goes with it.
 */
const themeOf = new WeakMap<Request, { theme: 'light' | 'dark'; csrf: string }>();

/**
 * The page of a request the app answers 503 because its database failed (see the last error
 * handler): what came of it, said for the route it met. A form the database failed before it called
 * the API did nothing, and the session is still there; one that had called the API (`sentToApi`)
 * may have changed something there, and the person is told to look before sending it again. A "Sign
 * in" that ended a signed-in session (`signedOut`: taken, its tokens revoked) before the database
 * failed to store the new one did something: the person is signed out, and is told so.
 */
function storeUnavailablePage(req: Request, done: { sentToApi: boolean; signedOut: boolean }): string {
  if (req.method === 'POST' && req.path === '/signout') {
    return appErrorPage(
      'Not signed out',
      'You are still signed in: the app could not reach its database, and nothing was done. Try again in a moment.',
    );
  }
  if (req.path === '/callback') {
    return appErrorPage(
      'Not signed in',
      'The app could not reach its database to finish the sign-in. Sign in again in a moment.',
    );
  }
  if (req.path === '/signin' && done.signedOut) {
    return appErrorPage(
      'Sign-in not started',
      'You are signed out here: your session ended, but the app could not reach its database to start the new sign-in. Sign in again in a moment.',
    );
  }
  if (req.path === '/signin') {
    return appErrorPage(
      'Sign-in not started',
      'The app could not reach its database, and nothing was done. Try again in a moment.',
    );
  }
  const charge = req.method === 'POST' && req.path === '/charges' ? chargeSoFar.get(req) : undefined;
  // A charge the API answered 2xx on this request went through: the outcome is known, and the page
  // says so, with nothing to send again.
  if (charge?.step === 'created') return chargeCreatedPage(charge);
  // A charge whose key stands for another charge ran nothing, and the same key would be refused
  // again: the page offers no same charge, only a new one from the home page.
  if (charge?.step === 'key-taken') {
    return appErrorPage(
      'Not charged',
      `This charge was not made: its key stands for an earlier charge sent with other details, so the API ran nothing for this one (${charge.status} ${charge.code}). The app could not reach its database to show more. Open the app again in a moment and make it as a new charge from the home page.`,
    );
  }
  // A charge the API refused on every attempt ran nothing: the outcome is known, and the same charge
  // sent again would be refused again. Nothing to offer but the form, with the reason once it is back.
  if (charge?.step === 'refused') {
    return appErrorPage(
      'Not charged',
      `The API refused this charge (${charge.status}), so nothing was charged, but the app could not reach its database to show why. Open the app again in a moment, check the amount and currency, and send the charge as a new one.`,
    );
  }
  // A charge that went out may have been created. What a person needs then is the retry spec 2.1
  // asks for, the same key: a page that only says "check before sending it again" leaves them a
  // new form, under a new key, and a second charge. So the page names the key and its form sends
  // the same charge again (same key, amount, currency; the CSRF token takes no database): the API
  // charges it at most once, and the page after it says what came of it.
  if (charge?.step === 'sending' && done.sentToApi) return chargeOutcomeUnknownPage(charge);
  // A theme that went out may or may not have been set; the same form again is safe (a PUT of the
  // whole settings document, see the route), so the page offers it.
  const theme = req.method === 'POST' && req.path === '/theme' && done.sentToApi ? themeOf.get(req) : undefined;
  if (theme !== undefined) return themeOutcomeUnknownPage(theme);
  if (req.method === 'POST' && done.sentToApi) {
    return appErrorPage(
      'Outcome not known',
      'Your request was sent to the API, but the app could not reach its database to show what came of it. Open the app again in a moment and check before sending it again.',
    );
  }
  if (req.method === 'POST') {
    return appErrorPage(
      'Not sent',
      'Nothing was done: the app could not reach its database, so this form was not sent. You are still signed in: send it again in a moment.',
    );
  }
  return appErrorPage('Unavailable', 'The app could not reach its database. Try again in a moment.');
}

/** The keys `@idem/client` makes (UUIDs) and nothing else, when a key comes back in a form. */
const keyShape = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The slots a flash waits in (UUIDs the app makes), as the page's `shown` query names them. */
const flashSlot = keyShape;

/**
 * Only same-origin relative paths: `/photos` yes; `//evil.example`, `/\evil.example`, `https://...` no.
 * Anything else becomes `/`, so "return to" can never be an open redirector (RFC 9700 section 4.11).
 *
 * @example
 * ```ts
 * safeReturnTo('/photos?x=1'); // '/photos?x=1'
 * safeReturnTo('//evil.example'); // '/'
 * ```
 */
export function safeReturnTo(value: unknown): string {
  if (typeof value !== 'string' || !value.startsWith('/') || value.startsWith('//') || value.startsWith('/\\'))
    return '/';
  // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are exactly what is refused.
  if (/[\u0000-\u001f\\]/.test(value)) return '/';
  return value;
}

/**
 * Builds the third-party app: "Sign in" (authorization code with state, nonce and PKCE), the callback
 * (state and `iss` checked, code exchanged server-to-server with the client secret, ID token validated
 * including its signature), tokens kept server-side behind an HttpOnly, SameSite=Lax cookie, refresh when
 * the access token is about to expire (one refresh at a time per session, across app processes on one
 * database too: two concurrent refreshes of a rotating token would look like reuse and revoke the grant), and revocation of the tokens of a session
 * that ends, by sign-out or by a new sign-in in the same browser.
 *
 * @example
 * ```ts
 * const port = await listen(8083);
 * const { app, flushLog } = await createThirdPartyApp({ db, issuer, clientId, clientSecret, appUrl: port.url, baseUrl });
 * port.use(app);
 * // At shutdown:
 * await port.close();
 * flushLog();
 * ```
 */
export async function createThirdPartyApp(options: ThirdPartyAppOptions): Promise<ThirdPartyApp> {
  const now = options.now ?? Date.now;
  // Parsed, not a prefix of the text: a scheme may be written in any case (`HTTPS://`).
  const secure = new URL(options.appUrl).protocol === 'https:';
  const { session: sessionCookie, csrf: csrfCookie } = cookieNames(secure);
  const redirectUri = new URL('/callback', options.appUrl).href;
  // Where the provider's logout sends the browser back (registered as the client's post-logout URI).
  const postLogoutRedirectUri = new URL('/', options.appUrl).href;
  // 8 hours after its last change, 12 after the password however much it is used (OWASP ASVS 3.3.2): 12
  // after the sign-in, and 12 after the `auth_time` of its ID token, which a sign-in that reused the
  // provider's session without the password carries from that earlier sign-in. The provider is asked
  // for a password no older than that (`max_age`): an older one would end the new session at once.
  // And 30 minutes (by default) after its last request, reads included (ASVS 3.3.2 at level 2).
  const lifetimeSeconds = appSessionLifetimeSeconds;
  // Checked here, by the name the caller wrote: the store would refuse it as its own `idleSeconds`.
  const idleSeconds = options.sessionIdleSeconds;
  if (idleSeconds !== undefined && (!Number.isSafeInteger(idleSeconds) || idleSeconds < seenEverySeconds)) {
    throw new TypeError(`sessionIdleSeconds must be a whole number of seconds, at least ${seenEverySeconds}`);
  }
  const sessions = createSessionStore(options.db, {
    ttlSeconds: 8 * 3600,
    lifetimeSeconds,
    idleSeconds,
  });
  const csrf = createCsrf({ key: await loadCsrfKey(options.db), cookieName: csrfCookie, path: '/', secure });
  const oidc = createOidcClient({
    issuer: options.issuer,
    clientId: options.clientId,
    clientSecret: options.clientSecret,
    redirectUri,
    resource: options.resource ?? options.baseUrl,
    scope: appScope,
    now,
    maxAgeSeconds: lifetimeSeconds,
  });
  const stockItems = options.stockItems ?? ['item-1', 'item-2', 'item-3'];
  const refreshMargin = options.refreshMargin ?? 30_000;
  const logger = options.onEvent ? undefined : eventLogger(now);
  const onEvent = options.onEvent ?? logger!.onEvent;
  const refresher = createRefresher({
    sessions,
    oidc,
    now,
    refreshMargin,
    // Tokens held unstored and untouched this long are of a session that has ended (idle).
    unstoredForMs: (idleSeconds ?? defaultIdleSeconds) * 1000,
    onRefused: (error) => notify(onEvent, { type: 'refresh-refused', error }),
    revoke: (tokens) => revokeTokens(tokens, 'refresh'),
    ...options.refreshTiming,
  });

  const send = (res: Response, status: number, html: string) => res.status(status).set(pageHeaders).send(html);
  const setSession = (res: Response, id: string) =>
    res.appendHeader('Set-Cookie', serializeCookie(sessionCookie, id, { path: '/', sameSite: 'Lax', secure }));
  const clearSession = (res: Response) =>
    res.appendHeader(
      'Set-Cookie',
      serializeCookie(sessionCookie, '', { path: '/', sameSite: 'Lax', secure, maxAge: 0 }),
    );

  // Each request's refreshes (see RefreshTurn): at most one that fails, however many reads it makes.
  const turns = new WeakMap<Request, RefreshTurn>();
  // The requests that sent a write to the API: a database that fails after that cannot say the form did nothing.
  const sentToApi = new WeakSet<Request>();
  // The requests that ended a signed-in session ("Sign in" again): a database that fails after that cannot say nothing was done.
  const signedOutBy = new WeakSet<Request>();
  const turnOf = (req: Request) => {
    let turn = turns.get(req);
    if (turn === undefined) {
      turn = { failed: false };
      turns.set(req, turn);
    }
    return turn;
  };

  /** The signed-in session with fresh tokens, or undefined (signed out, or the grant is gone). */
  const signedIn = async (req: Request): Promise<{ id: string; data: SessionData } | undefined> => {
    const id = readCookie(req, sessionCookie);
    const data = await sessions.get(id);
    if (data === undefined) {
      // A session that ended by its time (idle, or 12 hours after the password) goes as a sign-out
      // does: its refresh token would otherwise work at the provider until its own end (12 hours after the password).
      const ended = await sessions.takeEnded(id);
      if (id) refresher.forget(id);
      if (ended?.tokens) await revokeTokens(ended.tokens, 'timeout');
      return undefined;
    }
    if (!id || !data.tokens || !data.user) return undefined;
    const fresh = await refresher.fresh(id, data, turnOf(req));
    return fresh ? { id, data: fresh } : undefined;
  };

  /**
   * A new access token for the session of `req`, whose token `refused` the API refused (401
   * invalid_token: revoked, of a retired key, expired by the API's clock) while the session holds it
   * for valid. Asked by @idem/client with `{ refresh: true }`, once per call. Undefined when no other
   * token can be had (no refresh token, the provider unreachable, the grant gone): the call then ends
   * with the API's 401.
   */
  const refreshedToken = async (req: Request, refused: string | undefined): Promise<string | undefined> => {
    const session = await signedIn(req);
    const current = session?.data.tokens?.accessToken;
    // Signed out, or another request refreshed since this one was refused: the session's token is it.
    if (!session || refused === undefined || current !== refused) return current;
    return refresher.replaceRefused(session.id, refused, turnOf(req));
  };

  /**
   * Calls the API as the session of `req`, with its access token `token`. A 401 invalid_token (RFC
   * 6750 3.1: the gateway refused the token, which the session holds for valid) refreshes the session
   * once, through {@link refreshedToken}: the page's parallel reads refused at once share that one
   * refresh. The request then goes once more with the new token, and whatever it gets is the answer:
   * never a second refresh. Without another token (no refresh token, the provider unreachable) the 401
   * is the answer. A request is sent again only after the gateway refused it, before the API ran it.
   */
  const callApiAs = async (req: Request, token: string, request: ApiRequest): Promise<ApiResult> => {
    if (request.method !== 'GET') sentToApi.add(req);
    const result = await callApi(options.baseUrl, token, request);
    if (result.kind !== 'refused' || result.status !== 401) return result;
    if (!saysTokenInvalid(result.headers.get('www-authenticate'))) return result;
    const fresh = await refreshedToken(req, token);
    if (fresh === undefined || fresh === token) return result;
    return callApi(options.baseUrl, fresh, request);
  };

  /**
   * Revokes the tokens of a session that ended (RFC 7009): the refresh token, which revokes its grant
   * at the provider, and the access token. The provider revokes no JWT access token (they live 5
   * minutes) and says `unsupported_token_type`, which is no failure. A failure is reported, never
   * thrown: it must not keep anyone from signing in or out. False when one failed.
   *
   * A refresh of the same session may be in flight (another tab, here or in another process) and
   * rotate the refresh token after it was read here. No lock is needed for that: oidc-provider revokes
   * the whole grant when any of its refresh tokens is revoked, a consumed one included, and refuses a
   * refresh token whose grant is gone, so the rotated one is dead even when it is stored after the
   * revocation (`app.int.test.ts` holds the request at each interleaving).
   */
  const revokeTokens = async (
    tokens: SessionTokens | undefined,
    during: Extract<ThirdPartyAppEvent, { type: 'revocation-failed' }>['during'],
  ) => {
    const held = [
      { token: tokens?.refreshToken, tokenType: 'refresh_token' as const },
      { token: tokens?.accessToken, tokenType: 'access_token' as const },
    ];
    const revoked = await Promise.all(
      held.map(async ({ token, tokenType }) => {
        if (!token) return true;
        try {
          await oidc.revoke(token, tokenType);
          return true;
        } catch (error) {
          const unrevocable = error instanceof oauth.ResponseBodyError && error.error === 'unsupported_token_type';
          if (tokenType === 'access_token' && unrevocable) return true;
          notify(onEvent, { type: 'revocation-failed', during, tokenType, error: withoutToken(error, token) });
          return false;
        }
      }),
    );
    return revoked.every(Boolean);
  };

  const app = express();
  app.disable('x-powered-by');
  // One proxy in front (TRUST_PROXY=1): its hop only, never addresses the client wrote itself.
  app.set('trust proxy', process.env.TRUST_PROXY === '1' ? 1 : false);
  const form = express.urlencoded({ extended: false, limit: '8kb' });

  app.get('/', async (req, res) => {
    const session = await signedIn(req);
    if (!session) {
      // The cookie of a session that is over goes. One of a sign-in in progress stays: the provider's
      // page may be open in another tab, and its callback needs the state and verifier.
      const id = readCookie(req, sessionCookie);
      if (id && !(await sessions.get(id))?.pending?.length) clearSession(res);
      // Back from the provider's logout (below): say what happened. Anyone can link here with this
      // query; it only shows a sentence to a visitor who is signed out anyway.
      // Own members only: `constructor` or `toString` would find Object's functions, printed as text.
      const state = req.query.state;
      const notice =
        typeof state === 'string' && Object.hasOwn(signedOutNotices, state) ? signedOutNotices[state] : undefined;
      send(res, 200, signedOutPage(notice));
      return;
    }
    const { id, data } = session;
    const token = data.tokens!.accessToken;
    const call = (request: ApiRequest) => callApiAs(req, token, request);
    const [photos, stock, settings] = await Promise.all([
      call({ method: 'GET', path: '/photos' }),
      fetchStock(call, stockItems),
      call({ method: 'GET', path: '/settings' }),
    ]);
    // The message of the form this page answers, named in its URL: each tab takes its own, and a
    // message of another tab's form stays for that tab. Seen here in the session as read, and taken
    // (removed) only after the page's other statements, the last before it is shown: a database that
    // fails before that answers 503, and the message waits for the page sent again. Taken from the
    // session as it is now (only its slot is written), so tokens a concurrent refresh stored meanwhile stay.
    const slot = typeof req.query.shown === 'string' && flashSlot.test(req.query.shown) ? req.query.shown : undefined;
    const seen = slot === undefined ? undefined : data.flashes?.[slot];
    // This page shows the outcome of that charge: the person knows it now, so its key is no longer
    // kept, and the form below is a new charge. An unknown outcome (no answer, 409) keeps the key.
    if (seen?.charge?.settled) await sessions.closeCharge(id, seen.charge.key);
    // A charge sent from this session whose outcome no page has shown (its answer was lost: Back, a
    // reload, another tab) comes back with its key and details: sent again, the API replays it.
    // Otherwise a key per rendered form: a double click, or a reload that sends the form again, is one
    // operation. A form never sent is no operation yet, so two tabs opened to make two charges get two.
    const open = (await sessions.get(id))?.openCharge;
    // In one statement: of two loads of this page at once, one shows it.
    const flash = seen === undefined || slot === undefined ? undefined : await sessions.takeFlash(id, slot);
    send(
      res,
      200,
      homePage({
        user: data.user!,
        csrf: csrf.issue(req, res, id),
        chargeKey: open?.key ?? randomUUID(),
        openCharge: open,
        photos,
        stock,
        settings,
        ...(flash ? { flash } : {}),
      }),
    );
  });

  /**
   * Starts a sign-in in a fresh session: the transaction (state, nonce, verifier) is bound to this
   * browser. The session it replaces ends here, so its tokens are revoked at the provider first, as on
   * sign-out. Not later, at the callback: the provider gives the new sign-in the grant its own session
   * remembers for this app, so revoking the old tokens then would revoke the new ones with them.
   */
  const startSignIn = async (req: Request, res: Response, returnTo: string) => {
    let started: Awaited<ReturnType<typeof oidc.startSignIn>>;
    try {
      started = await oidc.startSignIn(returnTo);
    } catch {
      send(res, 503, signInFailedPage('The identity provider is unavailable. Try again later.'));
      return;
    }
    const oldId = readCookie(req, sessionCookie);
    // A sign-in already in progress in this browser (another tab pressed "Sign in" too) keeps its
    // transaction: each tab's callback finds its own by `state`.
    if (oldId && (await sessions.addPending(oldId, started.pending))) {
      res.set('Cache-Control', 'no-store').redirect(303, started.url.href);
      return;
    }
    // Taken, live or ended by its time (idle, 12 hours), in one statement: of two sign-ins (or a
    // sign-out) sent at once, one revokes its tokens. A read and then a delete let each revoke them.
    const old = await sessions.take(oldId);
    if (old?.user) signedOutBy.add(req);
    // Tokens held unstored go with it: revoking its (spent) refresh token revokes their grant too.
    if (oldId) refresher.forget(oldId);
    await revokeTokens(old?.tokens, 'sign-in');
    const id = await sessions.create({ pending: [started.pending] }, pendingTtlSeconds);
    setSession(res, id);
    res.set('Cache-Control', 'no-store').redirect(303, started.url.href);
  };

  // Any site can send the browser here: a top-level GET carries the SameSite=Lax cookie. So a GET
  // never ends a signed-in session (that would sign the user out and revoke their grant from a link);
  // it asks, and the form posts back with the session's CSRF token.
  app.get('/signin', async (req, res) => {
    const returnTo = safeReturnTo(req.query.return_to);
    const id = readCookie(req, sessionCookie);
    const data = await sessions.get(id);
    if (id && data?.user && data.tokens) {
      res.set('Cache-Control', 'no-store');
      send(res, 200, signInAgainPage({ user: data.user, csrf: csrf.issue(req, res, id), returnTo }));
      return;
    }
    await startSignIn(req, res, returnTo);
  });

  /**
   * The session a form was posted from, its CSRF token checked; `undefined` once the request is
   * answered. A form posted without a session (signed out in another tab, or the session ended) can
   * act on nothing: the person is shown the signed-out page, not told the form was forged.
   */
  const formSession = (req: Request, res: Response): string | undefined => {
    const id = readCookie(req, sessionCookie);
    if (!id) {
      res.set('Cache-Control', 'no-store').redirect(303, `/?state=${formUnsentState}`);
      return undefined;
    }
    // A page left open from before a new sign-in (in another tab) sends the old session's token too:
    // the token cannot tell that from a forgery, so the page names both, and the way on.
    if (!csrf.verify(req, id, req.body?.csrf)) {
      send(
        res,
        403,
        appErrorPage(
          'Request refused',
          'This form is from before your last sign-in, or was not sent from this app. Nothing was done: go back to the app and send it again from there.',
        ),
      );
      return undefined;
    }
    return id;
  };

  app.post('/signin', form, async (req, res) => {
    const id = formSession(req, res);
    if (id === undefined) return;
    await startSignIn(req, res, safeReturnTo(req.body?.return_to));
  });

  app.get('/callback', async (req, res) => {
    res.set('Referrer-Policy', 'no-referrer');
    const oldId = readCookie(req, sessionCookie);
    const state = typeof req.query.state === 'string' ? req.query.state : '';
    // Single use: the transaction is gone before anything else happens, so a replayed callback fails.
    const pending = await sessions.takePending(oldId, state);
    if (!oldId || !pending) {
      // Another tab's sign-in finished first and this browser is signed in: its code is not needed
      // (nor used: it could be anyone's), the person just goes on.
      if (await signedIn(req)) {
        res.set('Cache-Control', 'no-store').redirect(303, '/');
        return;
      }
      send(res, 400, signInFailedPage('This sign-in is unknown or was already used. Start again.'));
      return;
    }
    await sessions.destroy(oldId);
    clearSession(res);
    const callbackUrl = new URL(req.originalUrl, options.appUrl);
    let result: Awaited<ReturnType<typeof oidc.finishSignIn>>;
    try {
      result = await oidc.finishSignIn(callbackUrl, pending);
    } catch (error) {
      const cancelled = error instanceof oauth.AuthorizationResponseError && error.error === 'access_denied';
      send(res, 400, signInFailedPage(cancelled ? 'You cancelled the sign-in.' : undefined));
      return;
    }
    if (!result.user) {
      send(res, 400, signInFailedPage());
      return;
    }
    // A new session id after sign-in: an id planted before it (session fixation) is worthless.
    let id: string;
    try {
      id = await sessions.create({
        user: result.user,
        tokens: result.tokens,
        ...(result.authTime !== undefined ? { authTime: result.authTime } : {}),
      });
    } catch (error) {
      // The code is spent and its tokens are held nowhere: left alone, the refresh token would work at
      // the provider until its end (12 hours). Revoked as on sign-out, best effort, before the error
      // is answered. The revoked grant does not keep the next "Sign in" out: the app asks for consent
      // on every sign-in (offline_access), and that consent makes the grant the new tokens come from
      // (app-store-failure.int.test.ts signs in again right after).
      await revokeTokens(result.tokens, 'sign-in');
      throw error;
    }
    setSession(res, id);
    res.set('Cache-Control', 'no-store').redirect(303, pending.returnTo);
  });

  app.post('/signout', form, async (req, res) => {
    const id = formSession(req, res);
    if (id === undefined) return;
    // Taken, live or ended by its time meanwhile (it still holds tokens to revoke), in one statement:
    // of two sign-outs sent at once (a double click, two tabs), one revokes its tokens.
    // A database that fails here fails before anything was done: the last error handler answers 503,
    // the cookie stays, and the same form sent again signs out and revokes the tokens.
    const data = await sessions.take(id);
    refresher.forget(id);
    clearSession(res);
    // Revoking the refresh token revokes the grant at the provider, so nothing issued from it refreshes.
    const revoked = await revokeTokens(data?.tokens, 'sign-out');
    res.set('Cache-Control', 'no-store');
    // Then the browser signs out at the provider too (RP-initiated logout): its session (30 minutes idle) would
    // otherwise let the next person at this computer press "Sign in" and be alice after one click on
    // the consent page. The provider asks to confirm, then sends the browser back to the app's root.
    // A provider that could not be reached to revoke is not sent to: the page says so instead.
    const leave = revoked
      ? await oidc.endSessionUrl(postLogoutRedirectUri, signedOutState).catch(() => undefined)
      : undefined;
    if (leave) {
      res.redirect(303, leave.href);
      return;
    }
    send(
      res,
      200,
      signedOutPage(
        revoked
          ? 'You are signed out.'
          : 'You are signed out here; the identity provider could not be reached to revoke the tokens.',
      ),
    );
  });

  // Post/redirect/get: the message waits in its own slot, which the page it redirects to names. Only
  // that slot is written: `data` was read before the API call, and its tokens may have been rotated
  // since; and another tab's message stays for it.
  const showOnce = async (res: Response, id: string, flash: Flash) => {
    const slot = randomUUID();
    await sessions.setFlash(id, slot, flash);
    res.redirect(303, `/?shown=${slot}`);
  };

  const withSession =
    (handler: (req: Request, res: Response, id: string, data: SessionData) => Promise<void>) =>
    async (req: Request, res: Response) => {
      const id = formSession(req, res);
      if (id === undefined) return;
      const session = await signedIn(req);
      if (!session) {
        res.set('Cache-Control', 'no-store').redirect(303, `/?state=${formUnsentState}`);
        return;
      }
      await handler(req, res, session.id, session.data);
    };

  app.post(
    '/theme',
    form,
    withSession(async (req, res, id, data) => {
      const theme = req.body?.theme === 'dark' ? 'dark' : 'light';
      themeOf.set(req, { theme, csrf: csrf.issue(req, res, id) });
      // A write, sent again after a refresh when the first was refused 401 invalid_token: that answer
      // comes from the gateway's guard (or the API's check of the gateway's token), before the route
      // ran, so the repeat is the first time it runs. And PUT /settings replaces the whole document:
      // even run twice, it leaves the same theme.
      const result = await callApiAs(req, data.tokens!.accessToken, {
        method: 'PUT',
        path: '/settings',
        body: { theme },
      });
      // A 3xx (the API, or a proxy in front of it, redirecting the PUT, which `callApi` does not
      // follow) is no refusal and no 2xx: the theme may or may not be set. Said so, as the 503 page
      // of a theme that went out says it (themeOutcomeUnknownPage), the same form being safe again.
      const redirected = result.kind === 'refused' && result.status >= 300 && result.status < 400;
      const lines = redirected
        ? [
            `The API answered ${result.status} and not whether the theme was set: it may or may not have been set to ${theme}.`,
            'Setting the theme again does no harm: send the form again.',
          ]
        : describe(result, `Theme set to ${theme}.`);
      await showOnce(res, id, { title: 'Theme', lines });
    }),
  );

  app.post(
    '/charges',
    form,
    withSession(async (req, res, id) => {
      const amount = Number(req.body?.amount);
      const currency = String(req.body?.currency ?? '').toUpperCase();
      // "Send the same charge again" posts the key of the first one: the retry a user makes by hand
      // after a lost answer. Only the shape of a key the client itself makes is taken from the form.
      const repeatKey = typeof req.body?.key === 'string' && keyShape.test(req.body.key) ? req.body.key : undefined;
      // Kept before the API is called, so a Back or a reload that comes while it works finds the
      // charge (and its key) too. Only a charge that can run: one the API refuses on sight ran nothing,
      // and a new key for it is harmless. `open` is the session's open charge, this one's or not.
      const runnable = Number.isSafeInteger(amount) && amount > 0 && /^[A-Z]{3}$/.test(currency);
      const open =
        repeatKey !== undefined && runnable
          ? await sessions.openCharge(id, { key: repeatKey, amount, currency })
          : undefined;
      // What the API said, with this request's details: a kept form sent again after a refusal (which
      // ran nothing) may carry another amount, and that is the charge its key now stands for.
      const settle = async (outcome: 'created' | 'refused') => {
        if (repeatKey !== undefined && open?.key === repeatKey)
          await sessions.settleCharge(id, { key: repeatKey, amount, currency, outcome });
      };
      // @idem/client makes one key for this logical charge and reuses it on every retry (network
      // errors, 409 while the first attempt runs, 502-504), backing off about 1 s, 2 s, 4 s with
      // jitter. Each attempt reads the session's access token as it is then, refreshed if it is about
      // to expire (once per session, as for any request); none if the session ended meanwhile. After
      // a 401 invalid_token the client asks once for a token other than the one it sent
      // (`refresh: true`): the session is refreshed then, whatever its token's expiry says, or the
      // same refused token would go again.
      let given: string | undefined;
      const client = createClient({
        baseUrl: options.baseUrl,
        getToken: async ({ refresh }) => {
          given = refresh ? await refreshedToken(req, given) : (await signedIn(req))?.data.tokens?.accessToken;
          // With a token the charge goes out: from here on it may have run.
          if (given !== undefined) sentToApi.add(req);
          return given;
        },
        retry: { maxAttempts: 4, deadline: '15s', timeout: '5s' },
        ...options.retryTiming,
      });
      // The key is settled here, not left to the client to make, so that a database failing after the
      // charge went out can offer the same charge again under it (chargeSoFar, storeUnavailablePage).
      const key = repeatKey ?? randomUUID();
      if (runnable) chargeSoFar.set(req, { step: 'sending', key, amount, currency, csrf: csrf.issue(req, res, id) });
      const lines: string[] = [];
      let repeat: { key: string; amount: number; currency: string } | undefined;
      let charge: Flash['charge'];
      try {
        const result = await client.post('/charges', { amount, currency }, { idempotencyKey: key });
        // The client resolves on any status below 400, and does not follow a write's redirect: a 3xx
        // (the API, or a proxy in front of it, answering 303 or 307) is its answer. That is no 2xx,
        // and no refusal either: the charge may have run. Said so, and its key kept for the same
        // charge sent again, as after a lost answer; the 503 page's step stays `sending` (outcome unknown).
        if (result.status < 200 || result.status >= 300) {
          repeat = { key, amount, currency };
          charge = { key, settled: false };
          lines.push(
            `The API answered ${result.status} and not whether the charge was made: it may have gone through. Send it again with the same key to find out.`,
            `Idempotency-Key: ${key}`,
            `Attempts: ${result.attempts.length}`,
          );
        } else {
          // Before anything below meets the database: a 503 then says the charge was created, as the
          // API's 2xx on this request says.
          chargeSoFar.set(req, { step: 'created', key, amount, currency });
          await settle('created');
          if (result.key) {
            repeat = { key: result.key, amount, currency };
            charge = { key: result.key, settled: true };
          }
          lines.push(
            'Charge created.',
            `Idempotency-Key: ${result.key}`,
            `Status ${result.status}`,
            `Attempts: ${result.attempts.length}`,
            `Replayed: ${result.replayed ? 'yes' : 'no'}`,
            JSON.stringify(result.body),
          );
        }
      } catch (error) {
        if (!isRequestFailedError(error)) throw error;
        // The session's token could not be read (getToken): the app's database failed, not the API.
        // Its last error handler answers that, saying whether an earlier attempt went out.
        if (error.code === 'token_failed' && dbUnavailable(error.cause)) throw error.cause;
        const title =
          typeof error.body === 'object' && error.body !== null && 'title' in error.body
            ? String(error.body.title)
            : '';
        const code =
          typeof error.body === 'object' && error.body !== null && 'code' in error.body ? error.body.code : undefined;
        if (error.key && (code === 'fingerprint_mismatch' || code === 'idempotency_error')) {
          // Before the session is read: a 503 then says this charge was not made, offering no same key.
          if (error.status !== undefined) chargeSoFar.set(req, { step: 'key-taken', status: error.status, code });
          // Its key already stands for another charge (a kept form whose amount was changed, or an
          // old tab's form): this one never ran, whatever its earlier attempts met (had one run, its
          // record would hold this very request, and be replayed). Said in words, with that first
          // charge as far as this session knows it, and the way to make this one: the form below,
          // under a new key (the page that shows this ends the kept one).
          const first = (await sessions.get(id))?.openCharge;
          const known = first?.key === error.key ? first : undefined;
          lines.push(
            'Not charged: this form had already been sent with other details.',
            `Its key stands for that first charge only, so the API ran nothing for this one (${error.status} ${code}).`,
            known === undefined
              ? 'The first charge was shown on the page its own sending led to.'
              : known.outcome === 'created'
                ? `Your charge of ${known.amount} ${known.currency} went through: that is the first charge.`
                : `The first charge was of ${known.amount} ${known.currency}; whether it went through is not known here: send it again with its key to find out.`,
            `To charge ${amount} ${currency}, send the form below: it is a new charge.`,
            `Idempotency-Key: ${error.key}`,
          );
          if (known !== undefined && known.outcome !== 'created')
            repeat = { key: error.key, amount: known.amount, currency: known.currency };
          charge = { key: error.key, settled: true };
          await showOnce(res, id, { title: 'Create charge', lines, ...(repeat ? { repeat } : {}), charge });
          return;
        }
        // An attempt with no answer, a 5xx or a 409 (the first attempt still running) leaves the
        // outcome unknown, whatever came after it (a 401 once the session ended, a 429), and so does
        // a success whose answer could not be read: the charge may have gone through. Its key is kept
        // for the user's own retry (spec 2.1: the same key on every retry), never a new one. Refusals
        // alone (4xx on every attempt) ran nothing, and would be refused again.
        const unanswered = (status: number | undefined) => status === undefined || status >= 500 || status === 409;
        const mayHaveRun =
          error.attempts.some((attempt) => unanswered(attempt.status)) ||
          (error.status !== undefined && error.status < 400);
        if (mayHaveRun && error.key) repeat = { key: error.key, amount, currency };
        // Before anything below meets the database: a 503 then says nothing was charged.
        if (!mayHaveRun && error.status !== undefined) chargeSoFar.set(req, { step: 'refused', status: error.status });
        if (!mayHaveRun) await settle('refused');
        if (error.key) charge = { key: error.key, settled: !mayHaveRun };
        lines.push(
          error.status === undefined || error.status >= 500
            ? `API unavailable (${error.code}).`
            : error.status === 409
              ? 'Still in progress at the API (409): send it again with the same key in a moment.'
              : `The API refused: ${error.status} ${title}`.trim(),
          `Idempotency-Key: ${error.key ?? '(none)'}`,
          `Attempts: ${error.attempts.length}`,
        );
        // A refusal says what to change: "422 The request is not valid" alone leaves the person to
        // guess that the amount is over the limit. The API's problem detail (RFC 9457) says which.
        const detail =
          typeof error.body === 'object' && error.body !== null && 'detail' in error.body
            ? error.body.detail
            : undefined;
        if (!mayHaveRun && typeof detail === 'string' && detail !== '') lines.splice(1, 0, detail);
      }
      // The flash only: the charge may have taken 15 s, and a request of the same session may have
      // rotated the refresh token meanwhile; writing back the one read at the start would bring back a
      // used token, which the provider takes for reuse at the next refresh and revokes the grant.
      await showOnce(res, id, {
        title: 'Create charge',
        lines,
        ...(repeat ? { repeat } : {}),
        ...(charge ? { charge } : {}),
      });
    }),
  );

  app.use(
    methodNotAllowed(app, (_req, res, allow) =>
      send(res, 405, errorPage('Method not allowed', `This page takes ${allow.join(', ')}.`)),
    ),
  );
  // Express's own 404 page is not ours: it lacks the headers every page carries.
  app.use((_req: Request, res: Response) => send(res, 404, errorPage('Page not found', 'There is no page here.')));

  app.use((error: unknown, req: Request, res: Response, next: (error: unknown) => void) => {
    if (res.headersSent) {
      next(error);
      return;
    }
    // A form the body parser refused blames the request: its 4xx (413 too large, 415 an unknown charset
    // or encoding, 400 unreadable or aborted). Asked first: an aborted request's error carries the code
    // ECONNABORTED (or a socket's ECONNRESET), which a database's lost connection carries too, and is
    // no database's. Any form of the app lands here (a charge, the theme, sign-out): the page names no sign-in.
    const status = clientErrorStatus(error);
    if (status !== undefined) {
      send(res, status, appErrorPage('Form not read', 'This form could not be read. Go back and try again.'));
      return;
    }
    // The one place a database that failed (a connection refused or ended, a pool that timed out)
    // is answered, on any route: not a 500 (the house's HTTP table: a store that failed is a 503 with
    // Retry-After). The session cookie goes back as the browser sent it (a callback clears it before it
    // stores the new session): the person tries the same thing again with it.
    if (dbUnavailable(error)) {
      const cookies = [res.getHeader('Set-Cookie') ?? []].flat().map(String);
      res.removeHeader('Set-Cookie');
      for (const line of cookies) if (!line.startsWith(`${sessionCookie}=`)) res.appendHeader('Set-Cookie', line);
      res.set('Retry-After', String(storeRetryAfterSeconds));
      send(res, 503, storeUnavailablePage(req, { sentToApi: sentToApi.has(req), signedOut: signedOutBy.has(req) }));
      return;
    }
    send(res, 500, appErrorPage('Something went wrong', 'Please try again.'));
  });

  return { app, flushLog: () => logger?.flush() };
}

function describe(result: ApiResult, success: string): string[] {
  if (result.kind === 'unavailable') return [`API unavailable (${result.reason}).`];
  if (result.kind === 'refused') return [`The API refused: ${result.status} ${result.title}`];
  return [success, `Status ${result.status}`, JSON.stringify(result.body)];
}

async function fetchStock(
  call: (request: ApiRequest) => Promise<ApiResult>,
  items: readonly string[],
): Promise<ApiResult> {
  const results = await Promise.all(
    items.map((item) => call({ method: 'GET', path: `/stock?item=${encodeURIComponent(item)}` })),
  );
  const unavailable = results.find((result) => result.kind === 'unavailable');
  if (unavailable) return unavailable;
  const refused = results.find((result) => result.kind === 'refused');
  if (refused) return refused;
  const first = results[0];
  return {
    kind: 'ok',
    status: 200,
    body: results.map((result) => (result.kind === 'ok' ? result.body : null)),
    headers: first && first.kind === 'ok' ? first.headers : new Headers(),
  };
}
