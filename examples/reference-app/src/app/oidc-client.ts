import * as oauth from 'oauth4webapi';
import type { PendingSignIn, SessionTokens, SignedInUser } from './session-values.js';

/** What {@link createOidcClient} needs. */
export interface OidcClientOptions {
  /** The provider's issuer identifier; discovery must answer with exactly this `issuer`. */
  issuer: string;
  clientId: string;
  clientSecret: string;
  redirectUri: string;
  /** The API's resource indicator (RFC 8707): access tokens are bound to it. */
  resource: string;
  scope: string;
  /** Epoch milliseconds; injected so tests can age tokens without waiting. */
  now: () => number;
  /**
   * The longest ago, in seconds, the user may have given the password for a sign-in to be taken: sent
   * as `max_age`, so the provider asks for it again rather than reuse an older sign-in session, and
   * checked against the ID token's `auth_time`, which it makes the provider include. Unset, neither.
   */
  maxAgeSeconds?: number | undefined;
}

/** Tokens and the user after a successful callback or refresh. */
export interface SignInResult {
  tokens: SessionTokens;
  user?: SignedInUser;
  /** When the user gave the password, epoch seconds by the provider's clock: the ID token's `auth_time`. */
  authTime?: number;
}

/**
 * The third-party app's side of the protocol, on oauth4webapi: discovery, the authorization URL with
 * state, nonce and PKCE S256, the callback (state and `iss` checks, code exchange with the client
 * secret, ID token checks including its signature), refresh and revocation.
 *
 * @example
 * ```ts
 * const oidc = createOidcClient({ issuer, clientId, clientSecret, redirectUri, resource, scope, now: Date.now });
 * const { url, pending } = await oidc.startSignIn('/');
 * ```
 */
export interface OidcClient {
  startSignIn(returnTo: string): Promise<{ url: URL; pending: PendingSignIn }>;
  finishSignIn(callbackUrl: URL, pending: PendingSignIn): Promise<SignInResult>;
  refresh(refreshToken: string): Promise<SignInResult>;
  revoke(token: string, hint: 'refresh_token' | 'access_token'): Promise<void>;
  /**
   * Where the browser signs out at the provider too (RP-initiated logout), to come back to
   * `postLogoutRedirectUri` with `state`; undefined when the provider offers no such endpoint.
   */
  endSessionUrl(postLogoutRedirectUri: string, state: string): Promise<URL | undefined>;
}

const loopback = new Set(['localhost', '127.0.0.1', '[::1]']);

/** How long one request to the provider may take, in milliseconds, body included: then it is given up. */
export const providerTimeoutMs = 5000;

/**
 * The most requests {@link OidcClient.refresh} makes to the provider: discovery (once per process),
 * the token request, and its keys (to check the new ID token's signature). With
 * {@link providerTimeoutMs}, the longest a refresh takes: sessions.ts's refresh claim outlasts it.
 */
export const providerRequestsPerRefresh = 3;

/**
 * Creates an {@link OidcClient}.
 *
 * oauth4webapi refuses `http:` unless told otherwise. The option is turned on here only when the
 * issuer is plain http on a loopback host, which is the local demo and the tests; any other http
 * issuer is refused.
 *
 * @example
 * ```ts
 * const oidc = createOidcClient({ ...config, now: () => Date.now() });
 * ```
 */
export function createOidcClient(options: OidcClientOptions): OidcClient {
  const issuerUrl = new URL(options.issuer);
  const insecure = issuerUrl.protocol === 'http:' && loopback.has(issuerUrl.hostname);
  const http = { [oauth.allowInsecureRequests]: insecure, signal: () => AbortSignal.timeout(providerTimeoutMs) };
  const client: oauth.Client = { client_id: options.clientId };
  const clientAuth = oauth.ClientSecretBasic(options.clientSecret);
  let discovered: Promise<oauth.AuthorizationServer> | undefined;

  const server = () => {
    discovered ??= oauth
      .discoveryRequest(issuerUrl, { ...http, algorithm: 'oidc' })
      .then((response) => oauth.processDiscoveryResponse(issuerUrl, response))
      .catch((error: unknown) => {
        // Let the next sign-in try again instead of caching a failure for the life of the process.
        discovered = undefined;
        throw error;
      });
    return discovered;
  };

  const toResult = async (
    as: oauth.AuthorizationServer,
    response: Response,
    result: oauth.TokenEndpointResponse,
  ): Promise<SignInResult> => {
    let user: SignedInUser | undefined;
    const claims = oauth.getValidatedIdTokenClaims(result);
    if (claims) {
      // oauth4webapi trusts TLS for ID tokens from the token endpoint; we check the signature as well,
      // against the provider's JWKS, so a token endpoint that is not the provider cannot pass one off.
      await oauth.validateApplicationLevelSignature(as, response, http);
      user = {
        sub: claims.sub,
        ...(typeof claims.name === 'string' ? { name: claims.name } : {}),
        ...(typeof claims.email === 'string' ? { email: claims.email } : {}),
      };
    }
    const expiresIn = typeof result.expires_in === 'number' ? result.expires_in : 300;
    const authTime =
      typeof claims?.auth_time === 'number' && Number.isFinite(claims.auth_time) ? claims.auth_time : undefined;
    return {
      ...(authTime !== undefined ? { authTime } : {}),
      tokens: {
        accessToken: result.access_token,
        ...(result.refresh_token ? { refreshToken: result.refresh_token } : {}),
        ...(result.scope ? { scope: result.scope } : {}),
        expiresAt: options.now() + expiresIn * 1000,
      },
      ...(user ? { user } : {}),
    };
  };

  return {
    async startSignIn(returnTo) {
      const as = await server();
      if (!as.authorization_endpoint) throw new Error('the provider advertises no authorization endpoint');
      const pending: PendingSignIn = {
        state: oauth.generateRandomState(),
        nonce: oauth.generateRandomNonce(),
        codeVerifier: oauth.generateRandomCodeVerifier(),
        returnTo,
      };
      const url = new URL(as.authorization_endpoint);
      url.searchParams.set('client_id', options.clientId);
      url.searchParams.set('redirect_uri', options.redirectUri);
      url.searchParams.set('response_type', 'code');
      url.searchParams.set('scope', options.scope);
      url.searchParams.set('resource', options.resource);
      // offline_access (a refresh token) is granted only with an explicit consent prompt (OIDC Core 11).
      url.searchParams.set('prompt', 'consent');
      // The password no older than this: a sign-in session of the provider's that lives longer (it may
      // be set to) is not reused past it. The ID token then carries `auth_time` (OIDC Core 3.1.2.1).
      if (options.maxAgeSeconds !== undefined) url.searchParams.set('max_age', String(options.maxAgeSeconds));
      url.searchParams.set('state', pending.state);
      url.searchParams.set('nonce', pending.nonce);
      url.searchParams.set('code_challenge', await oauth.calculatePKCECodeChallenge(pending.codeVerifier));
      url.searchParams.set('code_challenge_method', 'S256');
      return { url, pending };
    },

    async finishSignIn(callbackUrl, pending) {
      const as = await server();
      // Checks `state` and RFC 9207 `iss` (required, since the provider advertises it) before any token request.
      const params = oauth.validateAuthResponse(as, client, callbackUrl, pending.state);
      const response = await oauth.authorizationCodeGrantRequest(
        as,
        client,
        clientAuth,
        params,
        options.redirectUri,
        pending.codeVerifier,
        http,
      );
      const result = await oauth.processAuthorizationCodeResponse(as, client, response, {
        expectedNonce: pending.nonce,
        requireIdToken: true,
        ...(options.maxAgeSeconds !== undefined ? { maxAge: options.maxAgeSeconds } : {}),
      });
      return toResult(as, response, result);
    },

    async refresh(refreshToken) {
      const as = await server();
      const response = await oauth.refreshTokenGrantRequest(as, client, clientAuth, refreshToken, http);
      const result = await oauth.processRefreshTokenResponse(as, client, response);
      return toResult(as, response, result);
    },

    async revoke(token, hint) {
      const as = await server();
      const response = await oauth.revocationRequest(as, client, clientAuth, token, {
        ...http,
        additionalParameters: { token_type_hint: hint },
      });
      await oauth.processRevocationResponse(response);
    },

    async endSessionUrl(postLogoutRedirectUri, state) {
      const as = await server();
      if (!as.end_session_endpoint) return undefined;
      const url = new URL(as.end_session_endpoint);
      // The client, not an `id_token_hint`: this address stays in the browser's history and the
      // provider's access logs, and an ID token there would hand the user's name and email to whoever
      // reads them. The provider asks the user to confirm either way, so the hint would add nothing.
      url.searchParams.set('client_id', options.clientId);
      url.searchParams.set('post_logout_redirect_uri', postLogoutRedirectUri);
      url.searchParams.set('state', state);
      return url;
    },
  };
}
