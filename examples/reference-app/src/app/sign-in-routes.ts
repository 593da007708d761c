import type { Request, Response } from 'express';
import * as oauth from 'oauth4webapi';
import { readCookie } from '../cookies.js';
import type { AppContext } from './app-context.js';
import { signedOutState } from './home-route.js';
import { signedOutPage, signInAgainPage, signInFailedPage } from './pages.js';
import { safeReturnTo } from './return-to.js';

/**
 * How long a sign-in in progress (a session with only its transaction) lives. The provider's login
 * step expires sooner; a visitor who opens "Sign in" and leaves must not hold a row for 8 hours.
 */
const pendingTtlSeconds = 15 * 60;

/**
 * Starts a sign-in in a fresh session: the transaction (state, nonce, verifier) is bound to this
 * browser. The session it replaces ends here, so its tokens are revoked at the provider first, as on
 * sign-out. Not later, at the callback: the provider gives the new sign-in the grant its own session
 * remembers for this app, so revoking the old tokens then would revoke the new ones with them.
 */
async function startSignIn(ctx: AppContext, req: Request, res: Response, returnTo: string) {
  const { oidc, send, sessions, sessionCookie, signedOutBy, refresher, revokeTokens, setSession } = ctx;
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
}

// Any site can send the browser here: a top-level GET carries the SameSite=Lax cookie. So a GET
// never ends a signed-in session (that would sign the user out and revoke their grant from a link);
// it asks, and the form posts back with the session's CSRF token.
export function getSignIn(ctx: AppContext) {
  const { sessions, csrf, send, sessionCookie } = ctx;
  return async (req: Request, res: Response) => {
    const returnTo = safeReturnTo(req.query.return_to);
    const id = readCookie(req, sessionCookie);
    const data = await sessions.get(id);
    if (id && data?.user && data.tokens) {
      res.set('Cache-Control', 'no-store');
      send(res, 200, signInAgainPage({ user: data.user, csrf: csrf.issue(req, res, id), returnTo }));
      return;
    }
    await startSignIn(ctx, req, res, returnTo);
  };
}

/** POST /signin: "Sign in" again from a signed-in session, its form's CSRF token checked. */
export function postSignIn(ctx: AppContext) {
  const { formSession } = ctx;
  return async (req: Request, res: Response) => {
    const id = formSession(req, res);
    if (id === undefined) return;
    await startSignIn(ctx, req, res, safeReturnTo(req.body?.return_to));
  };
}

/** GET /callback: the provider's answer to a sign-in. */
export function getCallback(ctx: AppContext) {
  const { sessions, send, clearSession, setSession, signedIn, revokeTokens, oidc, sessionCookie, appUrl } = ctx;
  return async (req: Request, res: Response) => {
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
    const callbackUrl = new URL(req.originalUrl, appUrl);
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
  };
}

/** POST /signout: ends the session, revokes its tokens, and signs out at the provider. */
export function postSignOut(ctx: AppContext) {
  const { sessions, send, clearSession, refresher, revokeTokens, oidc, formSession, postLogoutRedirectUri } = ctx;
  return async (req: Request, res: Response) => {
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
  };
}
