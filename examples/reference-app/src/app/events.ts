import { refusalLogger } from './refusal-log.js';
import type { ReportedError } from './reported-error.js';

/**
 * What the third-party app reports through `ThirdPartyAppOptions.onEvent`:
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
 * The default of `ThirdPartyAppOptions.onEvent`: a line on stderr. A revocation that failed, one
 * line each; refused refreshes counted (see {@link refusalLogger}): the first at once, then at most
 * one line a minute, by the app's clock `now`.
 */
export function eventLogger(now: () => number): { onEvent: (event: ThirdPartyAppEvent) => void; flush: () => void } {
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
