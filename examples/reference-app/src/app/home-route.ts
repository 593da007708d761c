import { randomUUID } from 'node:crypto';
import type { Request, Response } from 'express';
import { readCookie } from '../cookies.js';
import type { ApiRequest, ApiResult } from './api-client.js';
import type { AppContext } from './app-context.js';
import { flashSlot } from './key-shape.js';
import { homePage, signedOutPage } from './pages.js';

// The `state` the provider's logout hands back to the app's root: the sign-out went through.
export const signedOutState = 'signed-out';

// The `state` of the app's root after a form that came with no live session (it expired, its grant was
// revoked, or another tab signed out): the person asked for something, a charge say, and must not be
// left to wonder whether it went through.
export const formUnsentState = 'form-not-sent';

/** What the signed-out page says for the `state` the app's root was sent to; anyone can link there. */
const signedOutNotices: Record<string, string> = {
  [signedOutState]: 'You are signed out.',
  [formUnsentState]: 'Your session ended before this form arrived: nothing was done. Sign in to go on.',
};

/** GET /: the home page of a signed-in session, or the signed-out page. */
export function showHome(ctx: AppContext) {
  const { sessions, csrf, send, clearSession, signedIn, callApiAs, sessionCookie, stockItems } = ctx;
  return async (req: Request, res: Response) => {
    const session = await signedIn(req);
    if (!session) {
      // The cookie of a session that is over goes. One of a sign-in in progress stays: the provider's
      // page may be open in another tab, and its callback needs the state and verifier.
      const id = readCookie(req, sessionCookie);
      if (id && !(await sessions.get(id))?.pending?.length) clearSession(res);
      // Back from the provider's logout (see postSignOut): say what happened. Anyone can link here with this
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
  };
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
  // A refusal, or a redirect: the first read that brought no stock level says why for all of them.
  const notOk = results.find((result) => result.kind !== 'ok');
  if (notOk) return notOk;
  const first = results[0];
  return {
    kind: 'ok',
    status: 200,
    body: results.map((result) => (result.kind === 'ok' ? result.body : null)),
    headers: first && first.kind === 'ok' ? first.headers : new Headers(),
  };
}
