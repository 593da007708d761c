import express, { type Express } from 'express';
import type Provider from 'oidc-provider';
import { createCsrf } from '../csrf.js';
import type { Database } from '../db.js';
import { interactionErrors, interactionRoutes } from './interactions.js';
import { createLoginThrottle, type LoginThrottleOptions } from './login-throttle.js';
import { createPasswordChecker } from './passwords.js';
import { createProvider } from './provider.js';
import { loadCsrfKey } from './secrets.js';

/** What {@link createIdp} needs. */
export interface IdpOptions {
  db: Database;
  /** The issuer, the public URL of the provider: `http://localhost:8081` by default in `main.ts`. */
  issuer: string;
  /** The API's resource indicator (the gateway's base URL). */
  resource: string;
  /**
   * The login page's limits on wrong passwords: per name and address (10 per 15 minutes by default), and
   * per address across names (100 per 15 minutes by default, against password spraying).
   */
  loginThrottle?: LoginThrottleOptions | undefined;
  /**
   * Seconds after its first use during which a rotated refresh token is answered once more, with fresh
   * tokens, instead of revoking the grant: the retry of a refresh whose answer was lost. 30 by default;
   * 0 turns it off (every reuse revokes the grant). A whole number up to 14 days (1209600, a refresh
   * token's lifetime); anything else is a `TypeError`.
   */
  refreshTokenReuseSeconds?: number | undefined;
  /**
   * How long the sign-in session (the provider's cookie) lives after the password was given, however
   * often it is used, before the password is asked again: 12 hours (43200) by default, OWASP ASVS
   * 3.3.2 at level 2. A whole number of seconds up to 30 days (2592000, what level 1 allows); anything
   * else is a `TypeError`.
   */
  sessionLifetimeSeconds?: number | undefined;
  /**
   * How long the sign-in session lives without a visit (an app's "Sign in") before the password is
   * asked again: 30 minutes (1800) by default, OWASP ASVS 3.3.2 at level 2. A whole number of seconds
   * from 60 to the session's lifetime; anything else is a `TypeError`.
   */
  sessionIdleSeconds?: number | undefined;
  /**
   * Clients whose refresh tokens end this many seconds after the password (the ID token's
   * `auth_time`), each rotation included, instead of 14 days after their issue: a client whose own
   * session ends then (the third-party app's, 12 hours after the password) has no use for one later,
   * and whoever read it from its storage would keep the user's access. Other clients keep 14 days
   * (offline access). Each a whole number of seconds from 1 to 14 days; anything else is a `TypeError`.
   */
  refreshTokensEndAfterPassword?: Readonly<Record<string, number>> | undefined;
}

/** The identity provider: an Express app serving our pages in front of oidc-provider. */
export interface Idp {
  readonly app: Express;
  readonly provider: Provider;
  readonly issuer: string;
}

/**
 * Builds the identity provider. The database must be migrated ({@link migrateIdp}) first.
 *
 * @example
 * ```ts
 * const port = await listen(8081);
 * const idp = await createIdp({ db, issuer: port.url, resource: 'http://localhost:8080' });
 * port.use(idp.app);
 * ```
 */
export async function createIdp(options: IdpOptions): Promise<Idp> {
  const provider = await createProvider(options);
  const origin = new URL(options.issuer).origin;
  const csrf = createCsrf({
    key: await loadCsrfKey(options.db),
    cookieName: 'idp_csrf',
    path: '/interaction',
    secure: origin.startsWith('https:'),
  });
  const app = express();
  app.disable('x-powered-by');
  // Behind a proxy (TRUST_PROXY=1) the client's address is the last one of X-Forwarded-For: the one
  // that proxy appended. `true` would trust every hop and take the first, which the client writes
  // itself (a proxy appends to the client's own header), and a new one with each wrong password would
  // be a fresh count for the login throttle: no limit on guessing at all. One proxy, one hop.
  const trustProxy = process.env.TRUST_PROXY === '1';
  app.set('trust proxy', trustProxy ? 1 : false);
  const throttle = createLoginThrottle(options.loginThrottle);
  app.use(interactionRoutes({ provider, db: options.db, csrf, passwords: createPasswordChecker(), throttle, origin }));
  app.use('/interaction', interactionErrors);
  // The provider comes last and parses its own bodies. It builds every URL it hands out (discovery,
  // the resume URL of a sign-in, end_session) from the request's host and scheme: a Host, or an
  // X-Forwarded-Host, that names another host would be advertised (a jwks_uri on it too), and one that
  // is no host made each of them a 500. And it marks its cookies Secure only for a request it reads as
  // https, which, behind a proxy that ends TLS, arrives as plain http. The issuer is the provider's one
  // public address, whatever the client wrote: its host and scheme are set here as the forwarded ones
  // the provider (`proxy` on) reads. The client address is a proxy's word only with TRUST_PROXY=1.
  const issuerUrl = new URL(options.issuer);
  app.use((req, _res, next) => {
    req.headers.host = issuerUrl.host;
    req.headers['x-forwarded-host'] = issuerUrl.host;
    req.headers['x-forwarded-proto'] = issuerUrl.protocol.slice(0, -1);
    if (!trustProxy) delete req.headers['x-forwarded-for'];
    next();
  });
  app.use(provider.callback());
  return { app, provider, issuer: options.issuer };
}
