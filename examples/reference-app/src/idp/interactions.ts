import express, { type NextFunction, type Request, type Response, type Router } from 'express';
import type { Grant, default as Provider } from 'oidc-provider';
import { errors } from 'oidc-provider';
import { clientErrorStatus } from '../client-error.js';
import type { Csrf } from '../csrf.js';
import type { Database } from '../db.js';
import { dbUnavailable, storeRetryAfterSeconds } from '../db-unavailable.js';
import { errorPage, pageHeaders } from '../html.js';
import { methodNotAllowed } from '../methods.js';
import { credentialText, hasControlCharacters } from '../text.js';
import { ConsentedByAnother, finishConsentRead } from './adapter.js';
import { addConsent, takeBackConsent } from './consent-grant.js';
import type { RequestedScopes } from './consent-policy.js';
import type { LoginThrottle } from './login-throttle.js';
import { consentPage, invalidLoginMessage, loginPage, tooManyLogins } from './pages.js';
import type { PasswordChecker } from './passwords.js';
import { findUserById, findUserByUsername, maxPasswordLength, maxUsernameLength, upgradeCredentials } from './users.js';

/** What {@link interactionRoutes} needs. */
export interface InteractionRoutesOptions {
  provider: Provider;
  db: Database;
  csrf: Csrf;
  passwords: PasswordChecker;
  /** Counts failed sign-ins; a name and address past its limit waits (429) before any password is checked. */
  throttle: LoginThrottle;
  /** The provider's own origin; a form posted from any other origin is refused. */
  origin: string;
}

function send(res: Response, status: number, html: string): void {
  res.status(status).set(pageHeaders).send(html);
}

/**
 * A form may come with no `Origin` (old browsers), with `Origin: null` (our pages send
 * `Referrer-Policy: no-referrer`, which makes browsers hide the origin of form posts) or with ours.
 * Any other origin is a cross-site post and is refused before the CSRF token is even looked at.
 */
function foreignOrigin(req: Request, origin: string): boolean {
  const sent = req.headers.origin;
  return sent !== undefined && sent !== 'null' && sent !== origin;
}

const formBody = express.urlencoded({ extended: false, limit: '8kb' });

/**
 * What the consent page lists: every scope the request asks for (the consent prompt's `requested*`
 * details, see `consent-policy.ts`), those the grant holds (its `granted*` details) marked as allowed
 * before, and those it neither holds nor lacks (it refused them: oidc-provider asks no more about them,
 * and Allow adds only its `missing*` details) marked as refused before, not given. An interaction saved
 * before the `granted*` details existed marks what is not missing as allowed before, as it did; one
 * saved before the `requested*` details existed lists what the grant lacks.
 */
function asked(details: { prompt: { details: Record<string, unknown> } }) {
  const shown = details.prompt.details as Partial<RequestedScopes> & {
    missingOIDCScope?: string[];
    missingResourceScopes?: Record<string, string[]>;
  };
  const missingScopes = shown.missingOIDCScope ?? [];
  const missingResources = shown.missingResourceScopes ?? {};
  const notIn = (scopes: readonly string[], others: readonly string[]) =>
    scopes.filter((scope) => !others.includes(scope));
  const split = (requested: readonly string[], missing: readonly string[], granted: readonly string[] | undefined) => {
    const allowedBefore = granted ?? notIn(requested, missing);
    return { allowedBefore, refusedBefore: notIn(notIn(requested, missing), allowedBefore) };
  };
  const scopes = shown.requestedOIDCScope ?? missingScopes;
  const resources = shown.requestedResourceScopes ?? missingResources;
  const identity = split(scopes, missingScopes, shown.grantedOIDCScope);
  return {
    scopes,
    scopesAllowedBefore: identity.allowedBefore,
    scopesRefusedBefore: identity.refusedBefore,
    resources: Object.entries(resources).map(([resource, requested]) => {
      const granted = shown.grantedResourceScopes && (shown.grantedResourceScopes[resource] ?? []);
      return { resource, scopes: requested, ...split(requested, missingResources[resource] ?? [], granted) };
    }),
  };
}

/**
 * Saves `grant` without what Allow added for these consent prompt details (see `takeBackConsent`); no
 * save when it holds none of it.
 */
async function takenBack(grant: Grant, details: Record<string, unknown>): Promise<void> {
  if (takeBackConsent(grant, details)) await grant.save();
}

/**
 * The consents whose grant was saved when the sign-in could not finish, and could not be undone (see
 * the consent route): their error page cannot say nothing was done.
 */
const consentKept = new WeakSet<Request>();

/**
 * Our own login and consent pages on oidc-provider's interaction API, as an Express router mounted
 * before the provider. Body parsing is applied to these routes only: the provider parses its own.
 * Every POST answers with a 303 (never 307, which would re-post the password to the client).
 *
 * @example
 * ```ts
 * app.use(interactionRoutes({ provider, db, csrf, passwords, throttle: createLoginThrottle(), origin: issuer }));
 * app.use(provider.callback());
 * ```
 */
export function interactionRoutes(options: InteractionRoutesOptions): Router {
  const { provider, db, csrf, passwords, throttle, origin } = options;
  const router = express.Router();

  const clientName = async (clientId: unknown) => {
    const client = typeof clientId === 'string' ? await provider.Client.find(clientId) : undefined;
    return client?.clientName ?? (typeof clientId === 'string' ? clientId : 'an application');
  };

  /**
   * The grant an earlier POST of this interaction's consent named when it finished it, while that grant
   * is there (a POST whose interaction was saved though its database answered an error deleted it).
   */
  const consentedGrant = async (details: { result?: { consent?: { grantId?: unknown } } }) => {
    const id = details.result?.consent?.grantId;
    return typeof id === 'string' && id !== '' && (await provider.Grant.find(id)) ? id : undefined;
  };

  const guardPost = (req: Request, res: Response, uid: string): boolean => {
    if (foreignOrigin(req, origin) || !csrf.verify(req, uid, req.body?.csrf)) {
      send(res, 403, errorPage('Request refused', 'This form was not sent from this sign-in page. Start again.'));
      return false;
    }
    return true;
  };

  router.get('/interaction/:uid', async (req, res) => {
    const details = await provider.interactionDetails(req, res);
    const uid = details.uid;
    const token = csrf.issue(req, res, uid);
    const name = await clientName(details.params.client_id);
    if (details.prompt.name === 'login') {
      send(res, 200, loginPage({ uid, csrf: token, clientName: name }));
      return;
    }
    const accountId = details.session?.accountId;
    const user = accountId ? await findUserById(db, accountId) : undefined;
    send(
      res,
      200,
      consentPage({ uid, csrf: token, clientName: name, userName: user?.name ?? 'unknown user', ...asked(details) }),
    );
  });

  router.post('/interaction/:uid/login', formBody, async (req, res) => {
    const details = await provider.interactionDetails(req, res);
    if (!guardPost(req, res, details.uid)) return;
    if (details.prompt.name !== 'login') {
      send(res, 400, errorPage('Nothing to sign in', 'This step is already done. Start again from the application.'));
      return;
    }
    // Both in their one spelling (NFC, see credentialText): the composed and the decomposed forms of
    // a name are one account, and one name to the throttle, whichever a keyboard produced.
    const sent = typeof req.body.username === 'string' ? credentialText(req.body.username) : '';
    // No account has a control character in its name (and PostgreSQL refuses NUL outright), nor one
    // longer than any account may have: such a username is one more unknown user, never looked up,
    // never echoed back.
    const username = hasControlCharacters(sent) || sent.length > maxUsernameLength ? '' : sent;
    const typed = typeof req.body.password === 'string' ? credentialText(req.body.password) : '';
    // Too long to be anyone's password: it fails, after the same one verify as any wrong password.
    const tooLong = typed.length > maxPasswordLength;
    const password = tooLong ? '' : typed;
    const address = req.ip ?? '';
    const wait = throttle.retryAfter(username, address);
    if (wait > 0) {
      // Too many wrong passwords for this name from this address: nothing is checked until it waits.
      const token = csrf.issue(req, res, details.uid);
      const name = await clientName(details.params.client_id);
      res.set('Retry-After', String(wait));
      send(
        res,
        429,
        loginPage({ uid: details.uid, csrf: token, clientName: name, username, error: tooManyLogins(wait) }),
      );
      return;
    }
    // Counted as a failure now, before anything is awaited, and forgiven below if the password is
    // right. Counted only once the check failed, guesses sent all at once each passed the limit above
    // while the others were still being verified, and a script got every one of them checked.
    throttle.failed(username, address);
    const user = username ? await findUserByUsername(db, username) : undefined;
    // The same argon2id verifies, user or not (one per spelling of what was typed): the response time
    // must not say who exists.
    const matched = await passwords.match(tooLong ? undefined : user?.passwordHash, password);
    if (!user || matched === false) {
      const token = csrf.issue(req, res, details.uid);
      const name = await clientName(details.params.client_id);
      send(
        res,
        200,
        loginPage({ uid: details.uid, csrf: token, clientName: name, username, error: invalidLoginMessage }),
      );
      return;
    }
    throttle.succeeded(username, address);
    // An account an earlier version stored in the decomposed spelling is rewritten in NFC now that its
    // owner proved the password; if that fails, the sign-in goes on and the next one tries again.
    if (matched === 'nfd' || user.username !== credentialText(user.username)) {
      await upgradeCredentials(db, user, password).catch(() => undefined);
    }
    res.set('Cache-Control', 'no-store');
    await provider.interactionFinished(req, res, { login: { accountId: user.id } }, { mergeWithLastSubmission: false });
  });

  router.post('/interaction/:uid/consent', formBody, async (req, res) => {
    const details = await provider.interactionDetails(req, res);
    if (!guardPost(req, res, details.uid)) return;
    const accountId = details.session?.accountId;
    if (details.prompt.name !== 'consent' || !accountId) {
      send(res, 400, errorPage('Nothing to allow', 'This step is already done. Start again from the application.'));
      return;
    }
    const clientId = String(details.params.client_id);
    // This form was sent already and its POST finished the interaction, which the browser has not
    // followed yet (a double click, a reload that posts it again): the same way on, naming the grant
    // that POST made. No grant of this one's own: the interaction would name it instead, and the
    // first one's grant would be left behind, named by nothing until it expires.
    const consented = await consentedGrant(details);
    if (consented !== undefined) {
      res.set('Cache-Control', 'no-store');
      // Stored only while the interaction still names that grant (see `finishConsentRead`): a Cancel
      // stored since deleted it, and this finish would write it back over the cancel. Refused, it
      // answers the error page; the browser follows the Cancel, the later form.
      await finishConsentRead(details.result, () =>
        provider.interactionFinished(req, res, { consent: { grantId: consented } }, { mergeWithLastSubmission: true }),
      );
      return;
    }
    // The grant as it was before this consent (none for a new one): put back if the sign-in cannot
    // finish (below). A copy of its own, read apart from the one this consent changes.
    const before = details.grantId ? await provider.Grant.find(details.grantId) : undefined;
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId, clientId });
    if (!grant || (details.grantId && !before)) throw new errors.SessionNotFound('grant not found');
    addConsent(grant, details.prompt.details);
    const grantId = await grant.save();
    res.set('Cache-Control', 'no-store');
    try {
      try {
        // Stored only while the interaction names no other grant than it did when this POST read it,
        // nor holds a cancel stored since (see `finishConsentRead`), in the save's own statement: of
        // two requests side by side (a double click, Allow and Cancel), one finish is stored and the
        // other refused.
        await finishConsentRead(details.result, () =>
          provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true }),
        );
      } catch (error) {
        // The same as above, when the other POST finished the interaction after this one read it: this
        // POST's grant is new (an existing one is the grant both name, never refused) and nothing names
        // it, so it goes, best effort, and this POST answers the same way on, naming the other's.
        // When the other POST's grant is gone too (its finish was stored though its database answered
        // an error, and it deleted its grant), this POST's finish is made once more, against what the
        // interaction names now. Only then: a Cancel stored meanwhile names no grant at all, and was
        // stored first, so it wins; this POST's grant goes (below) and it answers its lost-the-race page.
        const again =
          error instanceof ConsentedByAnother && !before ? await provider.interactionDetails(req, res) : undefined;
        if (again === undefined) throw error;
        const named = again.result?.consent?.grantId;
        if (typeof named !== 'string' || named === '') throw error;
        const meanwhile = await consentedGrant(again);
        if (meanwhile === undefined) {
          await finishConsentRead(again.result, () =>
            provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true }),
          );
          return;
        }
        await grant.destroy().catch(() => undefined);
        await finishConsentRead(again.result, () =>
          provider.interactionFinished(
            req,
            res,
            { consent: { grantId: meanwhile } },
            { mergeWithLastSubmission: true },
          ),
        );
      }
    } catch (error) {
      // The grant is saved, but the interaction that would name it is not: its database failed, or
      // another POST of this form (a double click) finished it and the browser followed it on (the
      // interaction is gone: SessionNotFound). The sign-in does not go on from here, so this consent
      // is undone, best effort. A new grant is this POST's own (every POST of the form makes its own,
      // under its own id), which nothing names and no token came from: deleted. An existing grant is
      // the one every POST of this interaction widens: when another POST finished the interaction, its
      // sign-in runs on this same grant id, widened as this one widened it, and it stays; otherwise it
      // is saved back as it was read before this consent (the person's earlier tokens hold no more
      // than that). When the undo fails too (the database is still down), the grant stays as saved (a
      // new one unused until it expires) and a 503 page says that what was allowed may have been kept.
      if (!res.headersSent) {
        // The grant another POST's finished sign-in names is the interaction's own (details.grantId),
        // or that POST's new one: never this POST's new grant, whose id nothing else has.
        // A Cancel stored first (ConsentedByAnother at the interaction's own grant: a consent naming it
        // is never refused) names no grant: what this POST added is taken back, as the Cancel does.
        const cancelledFirst = grantId === details.grantId && error instanceof ConsentedByAnother;
        const namedByAnother = grantId === details.grantId && error instanceof errors.SessionNotFound;
        const undo = cancelledFirst
          ? takenBack(grant, details.prompt.details)
          : namedByAnother
            ? undefined
            : before
              ? before.save()
              : grant.destroy();
        const undone = await (undo ?? Promise.resolve()).then(
          () => true,
          () => false,
        );
        if (!undone) consentKept.add(req);
      }
      throw error;
    }
  });

  // An Allow that another POST beat (ConsentedByAnother): not the "Sign-in expired" page of a lost
  // interaction (the interaction is there, finished by the one that won), but a page that says which
  // won, as the interaction holds it now: a Cancel stores an `access_denied` result, another consent
  // the grant it names. Anything else (the interaction gone meanwhile, its database failing) goes on
  // to `interactionErrors`.
  router.use('/interaction/:uid/consent', async (error: unknown, req: Request, res: Response, next: NextFunction) => {
    if (!(error instanceof ConsentedByAnother) || res.headersSent) {
      next(error);
      return;
    }
    let result: { error?: unknown; consent?: { grantId?: unknown } } | undefined;
    try {
      result = (await provider.interactionDetails(req, res)).result;
    } catch (readError) {
      next(readError);
      return;
    }
    if (result?.error === 'access_denied') {
      send(
        res,
        400,
        errorPage(
          'Sign-in cancelled',
          'This sign-in was cancelled in another tab or window, so it was not allowed. Go back to the application.',
        ),
      );
    } else if (typeof result?.consent?.grantId === 'string' && result.consent.grantId !== '') {
      send(
        res,
        400,
        errorPage(
          'Already allowed',
          'This sign-in was already allowed in another tab or window. Go back to the application.',
        ),
      );
    } else {
      next(error);
    }
  });

  router.post('/interaction/:uid/abort', formBody, async (req, res) => {
    let details = await provider.interactionDetails(req, res);
    if (!guardPost(req, res, details.uid)) return;
    // Allow was sent first and finished the interaction, and its answer was not followed yet: the
    // person's last word is Cancel, the answer the browser follows, so the sign-in is cancelled. A
    // grant that Allow made (new: not the interaction's own) would be named by nothing once the
    // cancel is stored, so it goes, best effort (nothing names it: no sign-in resumes with it). From
    // a grant Allow widened (a re-consent), what it added is taken back before the browser is sent
    // on: left in, the next sign-in of that client would get it with no consent page. When that
    // save fails, the answer is the 503 page that says what was allowed may have been kept, and the
    // same Cancel sent again takes it back (the interaction then holds the cancel: see below).
    res.set('Cache-Control', 'no-store');
    // The cancel is stored only while the interaction names the grant it named when read (see
    // `finishConsentRead`): an Allow sent at the same time that finished it after this read would
    // otherwise be overwritten, its new grant unknown here and left named by nothing. Refused, the
    // interaction is read again and the cancel, still the later word, made against what it names now.
    // An Allow that read the interaction before this cancel was stored is refused in turn (the finish
    // stored first wins); one sent after it, that read it cancelled, is the later word: it wins, and
    // this answer leads the same way on, signed in.
    for (let attempt = 1; ; attempt++) {
      const allowed = details.result?.consent?.grantId;
      // A cancel stored already: this is the same Cancel sent again (a double click, or a retry of
      // the 503 page), and the take-back of the first may not have been saved.
      const cancelledBefore = details.result?.error === 'access_denied';
      let returnTo: string;
      try {
        returnTo = await finishConsentRead(details.result, () =>
          provider.interactionResult(
            req,
            res,
            { error: 'access_denied', error_description: 'The user cancelled the request' },
            { mergeWithLastSubmission: false },
          ),
        );
      } catch (error) {
        // Each refusal is one more Allow finished meanwhile: a few at most (a double click).
        if (!(error instanceof ConsentedByAnother)) throw error;
        if (attempt >= 3) {
          // The interaction holds the Allow that won, and the sign-in goes on from it: not the
          // "Sign-in expired" page of a lost interaction, which would say the link is dead.
          send(
            res,
            400,
            errorPage(
              'Already allowed',
              'This sign-in was already allowed in another tab or window, so it was not cancelled. Go back to the application.',
            ),
          );
          return;
        }
        details = await provider.interactionDetails(req, res);
        continue;
      }
      const { grantId: own, prompt } = details;
      if (typeof allowed === 'string' && allowed !== own) {
        await provider.Grant.find(allowed)
          .then((grant) => grant?.destroy())
          .catch(() => undefined);
      } else if (typeof own === 'string' && (allowed === own || cancelledBefore)) {
        try {
          const grant = await provider.Grant.find(own);
          if (grant) await takenBack(grant, prompt.details);
        } catch (error) {
          consentKept.add(req);
          throw error;
        }
      }
      res.status(303).set('Location', returnTo).set('Content-Length', '0').end();
      return;
    }
  });

  // A method these pages do not take: 405 with Allow (any other path goes on to the provider).
  router.use(
    methodNotAllowed(router, (_req, res, allow) =>
      send(res, 405, errorPage('Method not allowed', `This page takes ${allow.join(', ')}.`)),
    ),
  );
  return router;
}

/**
 * Express error handler for the interaction routes: a lost or expired interaction (the cookie is
 * gone, the uid is unknown) gets a plain page, not a stack trace; any other error that blames the
 * request, such as a form the body parser refused (too large, an unknown charset), gets its 4xx
 * status and a plain page too; a database that could not answer, a 503 with Retry-After and a page.
 *
 * @example
 * ```ts
 * app.use(interactionErrors);
 * ```
 */
export function interactionErrors(error: unknown, req: Request, res: Response, next: (error: unknown) => void): void {
  if (res.headersSent) {
    next(error);
    return;
  }
  if (error instanceof errors.SessionNotFound || error instanceof errors.InvalidRequest) {
    send(
      res,
      400,
      errorPage('Sign-in expired', 'This sign-in link is no longer valid. Start again from the application.'),
    );
    return;
  }
  const status = clientErrorStatus(error);
  if (status !== undefined) {
    send(
      res,
      status,
      errorPage(
        'Request refused',
        'This request could not be read. Go back and try again, or start again from the application.',
      ),
    );
    return;
  }
  // The one answer of these pages to a database that could not answer: not a 500 (DESIGN.md's HTTP
  // table: a store that failed is a 503 with Retry-After). Nothing was done, and the sign-in is still
  // there: the same page, or the same form sent again, goes on once the database is back. Unless a
  // consent's grant was saved and could not be taken back: that is said as it is.
  if (dbUnavailable(error)) {
    res.set('Retry-After', String(storeRetryAfterSeconds));
    send(
      res,
      503,
      errorPage(
        'Sign-in unavailable',
        consentKept.has(req)
          ? 'The sign-in service could not reach its database to finish this sign-in. What you allowed on this page may have been kept, but the sign-in did not go on and no application received anything from it. Try again in a moment.'
          : 'The sign-in service could not reach its database, and nothing was done. Try again in a moment.',
      ),
    );
    return;
  }
  send(res, 500, errorPage('Something went wrong', 'Please start again from the application.'));
}
