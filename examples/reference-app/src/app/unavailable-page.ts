import type { Request } from 'express';
import { chargeSoFar } from './charge-route.js';
import { appErrorPage, chargeCreatedPage, chargeOutcomeUnknownPage, themeOutcomeUnknownPage } from './pages.js';
import { themeOf } from './theme-route.js';

/**
 * The page of a request the app answers 503 because its database failed (see createThirdPartyApp's last error
 * handler): what came of it, said for the route it met. A form the database failed before it called
 * the API did nothing, and the session is still there; one that had called the API (`sentToApi`)
 * may have changed something there, and the person is told to look before sending it again. A "Sign
 * in" that ended a signed-in session (`signedOut`: taken, its tokens revoked) before the database
 * failed to store the new one did something: the person is signed out, and is told so.
 */
export function storeUnavailablePage(req: Request, done: { sentToApi: boolean; signedOut: boolean }): string {
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
  // whole settings document, see theme-route.ts), so the page offers it.
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
