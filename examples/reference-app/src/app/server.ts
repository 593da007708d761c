import { randomUUID } from 'node:crypto';
import { type ClientOptions, saysTokenInvalid } from '@idem/client';
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
import type { AppContext } from './app-context.js';
import { createCharge } from './charge-route.js';
import { eventLogger, type ThirdPartyAppEvent } from './events.js';
import { formUnsentState, showHome } from './home-route.js';
import { createOidcClient } from './oidc-client.js';
import { appErrorPage } from './pages.js';
import { createRefresher, type RefresherOptions, type RefreshTurn } from './refresh.js';
import { withoutToken } from './reported-error.js';
import {
  createSessionStore,
  defaultIdleSeconds,
  type Flash,
  type SessionData,
  type SessionTokens,
  seenEverySeconds,
} from './sessions.js';
import { getCallback, getSignIn, postSignIn, postSignOut } from './sign-in-routes.js';
import { setTheme } from './theme-route.js';
import { storeUnavailablePage } from './unavailable-page.js';

export type { ThirdPartyAppEvent } from './events.js';
export { safeReturnTo } from './return-to.js';

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

  const context: AppContext = {
    baseUrl: options.baseUrl,
    appUrl: options.appUrl,
    retryTiming: options.retryTiming,
    postLogoutRedirectUri,
    stockItems,
    sessionCookie,
    sessions,
    csrf,
    oidc,
    refresher,
    sentToApi,
    signedOutBy,
    send,
    setSession,
    clearSession,
    signedIn,
    refreshedToken,
    callApiAs,
    revokeTokens,
    formSession,
    withSession,
    showOnce,
  };

  // The routes, in this order (each in its own module).
  app.get('/', showHome(context));
  app.get('/signin', getSignIn(context));
  app.post('/signin', form, postSignIn(context));
  app.get('/callback', getCallback(context));
  app.post('/signout', form, postSignOut(context));
  app.post('/theme', form, withSession(setTheme(context)));
  app.post('/charges', form, withSession(createCharge(context)));

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
