import Provider, {
  type CanBePromise,
  type Configuration,
  errors,
  type KoaContextWithOIDC,
  type TokenEndpointGrantContext,
} from 'oidc-provider';
import { accessTokenClockTolerance } from '../clock-tolerance.js';
import type { Database } from '../db.js';
import { dpopAlgorithms } from '../dpop-algorithms.js';
import { escapeHtml, htmlPage, pageHeaders } from '../html.js';
import { apiScopes, asksForApiScope, carriesRoleScope } from '../scopes.js';
import { sqlAdapterFactory } from './adapter.js';
import { clientAuthErrors } from './client-auth-errors.js';
import { checkCodeResourceFirst, type GrantHandler } from './code-resource.js';
import { consentPolicy } from './consent-policy.js';
import { assertRefreshResource } from './granted-resource.js';
import { jwtIntrospection } from './jwt-introspection.js';
import { providerMethods } from './methods.js';
import { ownPages } from './own-pages.js';
import { logoutPage, signedOutPage } from './pages.js';
import { loadCookieKeys, loadSigningKeys } from './secrets.js';
import { defaultSessionLifetimeSeconds, sessionIdle, sessionLifetime, sessionTtl } from './session-lifetime.js';
import { databaseUnavailable } from './unavailable.js';
import { findUserById } from './users.js';
import { wholeSeconds } from './whole-seconds.js';

/** The OpenID Connect scopes, with the claims each one releases. */
export const oidcScopes = ['openid', 'profile', 'email', 'offline_access'] as const;

/** Lifetimes in seconds. Access and ID tokens live 5 minutes: a JWT access token cannot be revoked. */
export const tokenLifetimes = {
  AccessToken: 300,
  IdToken: 300,
  AuthorizationCode: 60,
  Interaction: 600,
  RefreshToken: 14 * 24 * 3600,
  /**
   * The most a sign-in session lives by default, counted from the password (see `session-lifetime.ts`;
   * `sessionLifetimeSeconds` sets it).
   */
  Session: defaultSessionLifetimeSeconds,
  Grant: 14 * 24 * 3600,
} as const;

/** What {@link createProvider} needs. */
export interface ProviderOptions {
  db: Database;
  /** The issuer identifier, e.g. `http://localhost:8081`; every endpoint lives under it. */
  issuer: string;
  /** The API's resource indicator (RFC 8707), the gateway's base URL; access tokens carry it as `aud`. */
  resource: string;
  /**
   * Seconds after its first use during which a rotated refresh token is answered once more instead of
   * revoking the grant (the reuse interval, `adapter.ts`); 30 by default, 0 for the strict rule.
   */
  refreshTokenReuseSeconds?: number | undefined;
  /**
   * How long the sign-in session lives after the password, however it is used (`session-lifetime.ts`);
   * 12 hours by default.
   */
  sessionLifetimeSeconds?: number | undefined;
  /**
   * How long the sign-in session lives without a visit (`session-lifetime.ts`); 30 minutes by default,
   * at most `sessionLifetimeSeconds`.
   */
  sessionIdleSeconds?: number | undefined;
  /** Clients whose refresh tokens end that many seconds after the password (see `createIdp`). */
  refreshTokensEndAfterPassword?: Readonly<Record<string, number>> | undefined;
}

/**
 * The identity provider on oidc-provider v9, configured to the reference app's rules:
 * authorization code only; PKCE S256 for every client; refresh tokens rotated on each use (a reused one
 * revokes the grant, oidc-provider's default on a consumed token, unless it is the retry of a refresh
 * whose answer was lost: once more within `refreshTokenReuseSeconds` of the first use); revocation (RFC 7009) and
 * introspection (RFC 7662); `iss` in authorization responses (RFC 9207, always on in v9); JWT access
 * tokens (`at+jwt`, RFC 9068) for one audience through resource indicators (RFC 8707), 5 minutes,
 * issued only when an API scope is asked for, and carrying the user's `roles` only next to a scope
 * that acts with them (`roleScopes` in `scopes.ts`); ID tokens with `sub`, `name`, `email`; storage on the
 * shared database; no development interactions (our own pages are in `interactions.ts`), and our own
 * logout pages, account switch and form_post pages (`own-pages.ts`), with the same headers as every
 * other page.
 *
 * @example
 * ```ts
 * const provider = await createProvider({ db, issuer: 'http://localhost:8081', resource: 'http://localhost:8080' });
 * expressApp.use(provider.callback());
 * ```
 */
export async function createProvider(options: ProviderOptions): Promise<Provider> {
  const { db, issuer, resource } = options;
  // First: it refuses a bad reuse interval before anything is read.
  const adapter = sqlAdapterFactory(db, {
    refreshTokenReuseSeconds: options.refreshTokenReuseSeconds,
    sessionLifetimeSeconds: options.sessionLifetimeSeconds,
    sessionIdleSeconds: options.sessionIdleSeconds,
  });
  const sessionLifetimeSeconds = sessionLifetime(options.sessionLifetimeSeconds);
  const sessionIdleSeconds = sessionIdle(options.sessionIdleSeconds, sessionLifetimeSeconds);
  const passwordBound = new Map(
    Object.entries(options.refreshTokensEndAfterPassword ?? {}).map(([clientId, seconds]) => [
      clientId,
      wholeSeconds(seconds, `refreshTokensEndAfterPassword.${clientId}`, 1, tokenLifetimes.RefreshToken),
    ]),
  );
  const [keys, cookieKeys] = await Promise.all([loadSigningKeys(db), loadCookieKeys(db)]);

  // A client that names no resource gets the API only when it asks for an API scope. One that asks
  // for `openid` alone gets an opaque token for UserInfo, not an API token with no scope in it.
  const defaultResource = (ctx: KoaContextWithOIDC, oneOf?: readonly string[]) =>
    oneOf || asksForApiScope(ctx.oidc.params?.scope) ? resource : undefined;

  // oidc-provider registers its grant handlers while it is constructed, through this public method:
  // overriding it is the one way to run a step ahead of its authorization_code handler. A code redeemed
  // for a resource it was not granted is refused there, before the handler consumes it.
  let codeHandlerChecked = false;
  class ReferenceProvider extends Provider {
    override registerGrantType<Params extends object>(
      name: string,
      handler: (ctx: TokenEndpointGrantContext<Params>) => CanBePromise<void>,
      params?: string | readonly string[] | ReadonlySet<string>,
      duplicates?: string | readonly string[] | ReadonlySet<string>,
    ): void {
      // oidc-provider's own handler takes no parameters of its own type: the plain grant context.
      const isCode = name === 'authorization_code';
      codeHandlerChecked ||= isCode;
      const checked = isCode ? checkCodeResourceFirst(handler as GrantHandler, defaultResource) : handler;
      super.registerGrantType(name, checked, params, duplicates);
    }
  }

  // Only a client that proved who it is (RFC 7662 section 2.1: the endpoint MUST require some
  // authorization), and only about its own tokens. The public client's `client_id` is no proof: anyone
  // could send it and read the user, scopes and expiry of its tokens. Revocation stays open to it (RFC
  // 7009 allows that). Opaque tokens (oidc-provider) and JWTs (`jwtIntrospection`) alike.
  const mayIntrospect = (
    client: { clientId: string; clientAuthMethod?: string | undefined },
    tokenClientId: string | undefined,
  ) => client.clientAuthMethod !== 'none' && tokenClientId === client.clientId;

  const configuration: Configuration = {
    adapter,
    jwks: { keys: keys as NonNullable<Configuration['jwks']>['keys'] },
    cookies: {
      keys: cookieKeys,
      long: { httpOnly: true, sameSite: 'lax' },
      short: { httpOnly: true, sameSite: 'lax' },
      // Over https the sign-in session (Path=/, no Domain) is `__Host-`: a browser then refuses a
      // cookie of that name set by a sibling subdomain, which could sign the visitor in as someone
      // else (login CSRF by a tossed session). The interaction cookies are path-scoped, so
      // `__Secure-` is the most they can carry.
      ...(new URL(issuer).protocol === 'https:'
        ? {
            names: {
              session: '__Host-session',
              interaction: '__Secure-interaction',
              resume: '__Secure-interaction_resume',
            },
          }
        : {}),
    },
    responseTypes: ['code'],
    // The methods the registered clients use: a secret (oidc-provider takes it in Basic or the body
    // alike) or none for the public client. Discovery then lists no assertion methods nobody can use.
    clientAuthMethods: ['client_secret_basic', 'client_secret_post', 'none'],
    // DPoP proofs (RFC 9449) only with the algorithms the gateway takes too: a token bound with any
    // other would be one the API refuses.
    enabledJWA: { dPoPSigningAlgValues: [...dpopAlgorithms] },
    // Every client, confidential ones too, must send an S256 challenge (v9 supports no other method).
    pkce: { required: () => true },
    // Every refresh rotates; presenting a consumed refresh token revokes the whole grant, past the reuse
    // interval (the adapter reads one used within it as unused, once: see `adapter.ts`). A refresh
    // refused for its resource is refused before the rotation, so it does not use the token up (a code
    // redemption likewise, in `ReferenceProvider` above).
    rotateRefreshToken: (ctx) => {
      assertRefreshResource(ctx, defaultResource);
      return true;
    },
    scopes: [...oidcScopes],
    claims: { openid: ['sub'], profile: ['name'], email: ['email'] },
    // The access token is bound to the API, so it cannot call UserInfo: the ID token carries the claims.
    conformIdTokenClaims: false,
    allowOmittingSingleRegisteredRedirectUri: false,
    clientDefaults: {
      grant_types: ['authorization_code'],
      response_types: ['code'],
      id_token_signed_response_alg: 'RS256',
      token_endpoint_auth_method: 'client_secret_basic',
    },
    // No CORS beyond discovery and JWKS: the clients here are server-side or native.
    clientBasedCORS: () => false,
    // The sign-in session ends 30 minutes (by default) after its last visit, and 12 hours after the
    // password was given however it is used (`session-lifetime.ts`): oidc-provider saves it again, with
    // this TTL, on each visit, and the row's expiry is counted by the database's clock.
    ttl: {
      ...tokenLifetimes,
      Session: (_ctx, session) =>
        sessionTtl(session.loginTs, Math.floor(Date.now() / 1000), sessionLifetimeSeconds, sessionIdleSeconds),
      // Counted from the password at each issue, a rotation's too (oidc-provider carries `authTime`
      // over), so no rotation extends it; 14 days for every other client. `sessionTtl` is the same
      // sum: what is left of a lifetime from a time in epoch seconds, at least 1.
      RefreshToken: (_ctx, token, client) => {
        const afterPassword = passwordBound.get(client.clientId);
        if (afterPassword === undefined) return tokenLifetimes.RefreshToken;
        return sessionTtl(token.authTime, Math.floor(Date.now() / 1000), afterPassword);
      },
    },
    // The consent prompt carries everything the request asks for, for the consent page to list all
    // of it (`consent-policy.ts`), not only what the grant lacks.
    interactions: { policy: consentPolicy(), url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
    features: {
      devInteractions: { enabled: false },
      revocation: {
        enabled: true,
        // A client may revoke only its own tokens; answering 200 for anything else gives no oracle.
        allowedPolicy: async (_ctx, client, token) => token.clientId === client.clientId,
      },
      introspection: {
        enabled: true,
        allowedPolicy: async (_ctx, client, token) => mayIntrospect(client, token.clientId),
      },
      rpInitiatedLogout: {
        enabled: true,
        // The defaults can be framed and @import Google Fonts; ours carry the headers of every other
        // page. `form` is the provider's hidden form (its action and xsrf token); the buttons submit it.
        async logoutSource(ctx, form) {
          ctx.set(pageHeaders);
          ctx.body = logoutPage({ form, clientName: ctx.oidc.client?.clientName });
        },
        async postLogoutSuccessSource(ctx) {
          ctx.set(pageHeaders);
          ctx.body = signedOutPage({ clientName: ctx.oidc.client?.clientName });
        },
      },
      resourceIndicators: {
        enabled: true,
        defaultResource: (ctx, _client, oneOf) => defaultResource(ctx, oneOf),
        // The token request need not repeat `resource`: the granted one is used.
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, indicator) => {
          if (indicator !== resource) throw new errors.InvalidTarget();
          return {
            scope: apiScopes.join(' '),
            audience: resource,
            accessTokenTTL: tokenLifetimes.AccessToken,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
    async findAccount(_ctx, sub) {
      const user = await findUserById(db, sub);
      if (!user) return undefined;
      return {
        accountId: user.id,
        async claims() {
          return { sub: user.id, name: user.name, email: user.email };
        },
      };
    },
    // Roles travel in the access token so the API can authorize without calling back here, but only in
    // a token with a scope that acts with them: a role is what the user is, not what a client may do.
    async extraTokenClaims(_ctx, token) {
      const accountId = 'accountId' in token ? token.accountId : undefined;
      if (!accountId || !carriesRoleScope(token.scope)) return undefined;
      const user = await findUserById(db, accountId);
      return user ? { roles: user.roles } : undefined;
    },
    async renderError(ctx: KoaContextWithOIDC, out) {
      ctx.set(pageHeaders);
      ctx.type = 'html';
      // The error and its description only, both from oidc-provider's own tables. `out` also carries
      // the request's `state`, which whoever wrote the link chose: shown on this page it reads as the
      // provider speaking ("your account is locked, call ..."), on the provider's own origin.
      const lines = Object.entries(out)
        .filter(([key]) => key === 'error' || key === 'error_description')
        .map(([key, value]) => `<p><strong>${escapeHtml(key)}</strong>: ${escapeHtml(value)}</p>`)
        .join('\n');
      ctx.body = htmlPage('Sign-in error', `<h1>Sign-in error</h1>\n${lines}`);
    },
  };

  const provider = new ReferenceProvider(issuer, configuration);
  // A later oidc-provider that registers its handlers another way would skip the check without a word.
  if (!codeHandlerChecked) throw new Error('oidc-provider registered no authorization_code handler to check');
  // The steps oidc-provider answers with pages of its own, out of reach of the hooks above: the logout
  // of a visitor with no session, the account switch, the form_post response mode.
  // A database that could not answer: 503 with Retry-After, not 500 server_error. First, so that it
  // sees what the middlewares below throw as well.
  provider.use(databaseUnavailable(provider));
  provider.use(ownPages(db));
  // A method a provider path does not take: 405 with Allow, not Koa's plain-text 404.
  provider.use(providerMethods());
  // A request naming no client at all: 401 invalid_client (RFC 6749 section 5.2), not 400.
  provider.use(clientAuthErrors(issuer));
  // A JWT access token at introspection: described (RFC 7662), not refused with 400 unsupported_token_type.
  provider.use(jwtIntrospection({ provider, issuer, keys, clockTolerance: accessTokenClockTolerance, mayIntrospect }));
  // Koa reads the host and scheme from X-Forwarded-Host and X-Forwarded-Proto, which createIdp sets
  // from the issuer on every request (whatever the client sent): URLs are built on the issuer, and an
  // https issuer's cookies are Secure even behind a proxy that ends TLS.
  provider.proxy = true;
  return provider;
}
