// Third-party relying parties and resource servers against the reference app, unmodified: oauth4webapi
// (a certified RP, strict by design; openid-client v6 wraps it) drives discovery, the code flow with
// PKCE, refresh, revocation, introspection, UserInfo, PAR and DPoP; jose checks the tokens against the
// published JWKS on its own; the gateway's refusals are read the way a client library reads them
// (RFC 6750, RFC 9728). What discovery advertises must work with what these libraries send.
import {
  createRemoteJWKSet,
  decodeJwt,
  decodeProtectedHeader,
  generateKeyPair,
  importJWK,
  type JWTPayload,
  errors as joseErrors,
  jwtVerify,
  SignJWT,
} from 'jose';
import * as oauth from 'oauth4webapi';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { saveClient } from '../src/idp/clients.js';
import { loadSigningKeys } from '../src/idp/secrets.js';
import { storedId } from '../src/idp/stored-id.js';
import { loginAndConsent } from './flow.js';
import { alice } from './test-idp.js';
import { startWholeStack, type WholeStack } from './test-stack.js';
import { createUserAgent } from './user-agent.js';

// The demo runs on plain http on loopback; every oauth4webapi call must be told so (README).
const insecure = { [oauth.allowInsecureRequests]: true } as const;

let whole: WholeStack;
// The gateway's clock, moved forward by a test to see an access token expire there (no sleeping).
let skewMs = 0;
const auth = () => whole.running.authUrl;
const gateway = () => whole.stack.gateway.baseUrl;

beforeAll(async () => {
  whole = await startWholeStack('rp_interop', { now: () => Date.now() + skewMs });
}, 60_000);

afterAll(async () => {
  await whole?.close();
});

/** The provider's metadata, through the library's own discovery (which compares `issuer` exactly). */
async function discover(algorithm: 'oidc' | 'oauth2' = 'oidc'): Promise<oauth.AuthorizationServer> {
  const issuer = new URL(auth());
  return oauth.processDiscoveryResponse(issuer, await oauth.discoveryRequest(issuer, { algorithm, ...insecure }));
}

interface RelyingParty {
  client: oauth.Client;
  clientAuth: oauth.ClientAuth;
  redirectUri: string;
}

/** The third-party app as an RP: confidential, `client_secret_basic` unless `auth` says otherwise. */
function confidential(clientAuth?: oauth.ClientAuth): RelyingParty {
  const { clientId, clientSecret, redirectUri } = whole.running.clients.app;
  return {
    client: { client_id: clientId },
    clientAuth: clientAuth ?? oauth.ClientSecretBasic(clientSecret),
    redirectUri,
  };
}

/** The public native client (`cli-pkce`), on a loopback port of its choosing (RFC 8252 section 7.3). */
function publicClient(): RelyingParty {
  return {
    client: { client_id: whole.running.clients.publicClient.clientId },
    clientAuth: oauth.None(),
    redirectUri: 'http://127.0.0.1:4399/callback',
  };
}

interface FlowOptions {
  scope?: string;
  resource?: string | undefined;
  dpop?: oauth.DPoPHandle;
}

/**
 * The code flow as oauth4webapi runs it: state, nonce and PKCE S256 from the library, the login and
 * consent through the provider's forms, then `validateAuthResponse` (state and RFC 9207 `iss`), the
 * code exchange and the ID token checks (nonce, aud, iss, exp).
 */
async function libraryFlow(rp: RelyingParty, options: FlowOptions = {}) {
  const as = await discover();
  const verifier = oauth.generateRandomCodeVerifier();
  const state = oauth.generateRandomState();
  const nonce = oauth.generateRandomNonce();
  const url = new URL(as.authorization_endpoint ?? '');
  url.searchParams.set('client_id', rp.client.client_id);
  url.searchParams.set('redirect_uri', rp.redirectUri);
  url.searchParams.set('response_type', 'code');
  url.searchParams.set('scope', options.scope ?? 'openid profile email offline_access photos:read');
  url.searchParams.set('state', state);
  url.searchParams.set('nonce', nonce);
  url.searchParams.set('code_challenge', await oauth.calculatePKCECodeChallenge(verifier));
  url.searchParams.set('code_challenge_method', 'S256');
  // A refresh token needs prompt=consent with offline_access (OIDC Core 11).
  url.searchParams.set('prompt', 'consent');
  const resource = 'resource' in options ? options.resource : gateway();
  if (resource) url.searchParams.set('resource', resource);
  const callback = await loginAndConsent(createUserAgent(), auth(), url.href, rp.redirectUri, alice);
  const params = oauth.validateAuthResponse(as, rp.client, callback, state);
  const response = await oauth.authorizationCodeGrantRequest(
    as,
    rp.client,
    rp.clientAuth,
    params,
    rp.redirectUri,
    verifier,
    { ...insecure, ...(options.dpop ? { DPoP: options.dpop } : {}) },
  );
  const tokens = await oauth
    .processAuthorizationCodeResponse(as, rp.client, response, { expectedNonce: nonce, requireIdToken: true })
    .catch((error: unknown) => {
      // The provider's own words, not only the library's "server responded with an error".
      if (error instanceof oauth.ResponseBodyError) throw new Error(`${error.error}: ${error.error_description}`);
      throw error;
    });
  return { as, tokens, callback, claims: oauth.getValidatedIdTokenClaims(tokens) };
}

/** RFC 7662 introspection by `rp`, made and read by the library (which throws on anything but a 200). */
async function introspect(as: oauth.AuthorizationServer, rp: RelyingParty, token: string) {
  const response = await oauth.introspectionRequest(as, rp.client, rp.clientAuth, token, insecure);
  expect(response.status).toBe(200);
  expect(response.headers.get('cache-control')).toBe('no-store');
  return oauth.processIntrospectionResponse(as, rp.client, response);
}

describe('discovery and keys, read by a strict client', () => {
  it('passes oauth4webapi discovery (OpenID and RFC 8414) with the issuer exactly as configured', async () => {
    const oidc = await discover('oidc');
    const oauth2 = await discover('oauth2');
    expect(oidc.issuer).toBe(auth());
    expect(oauth2).toEqual(oidc);
    expect(oidc.response_types_supported).toEqual(['code']);
    expect(oidc.code_challenge_methods_supported).toEqual(['S256']);
    expect(oidc.authorization_response_iss_parameter_supported).toBe(true);
  });

  it('answers every endpoint discovery names (not 404, not a 5xx)', async () => {
    const as = (await discover()) as unknown as Record<string, unknown>;
    const endpoints = Object.entries(as).filter(([name]) => name.endsWith('_endpoint') || name === 'jwks_uri');
    expect(endpoints.map(([name]) => name).sort()).toEqual(
      [
        'authorization_endpoint',
        'end_session_endpoint',
        'introspection_endpoint',
        'jwks_uri',
        'pushed_authorization_request_endpoint',
        'revocation_endpoint',
        'token_endpoint',
        'userinfo_endpoint',
      ].sort(),
    );
    for (const [name, value] of endpoints) {
      const url = String(value);
      expect(url.startsWith(`${auth()}/`), name).toBe(true);
      const get = name === 'jwks_uri' || name === 'authorization_endpoint' || name === 'end_session_endpoint';
      const response = await fetch(url, { method: get ? 'GET' : 'POST', redirect: 'manual' });
      expect(response.status, name).not.toBe(404);
      expect(response.status, name).toBeLessThan(500);
    }
  });

  it('publishes a JWKS that jose takes, with a key for every advertised ID token algorithm', async () => {
    const as = await discover();
    const jwks = (await (await fetch(as.jwks_uri ?? '')).json()) as { keys: Array<Record<string, unknown>> };
    for (const alg of as.id_token_signing_alg_values_supported ?? []) {
      expect(jwks.keys.some((key) => key.alg === alg || (key.alg === undefined && key.kty === 'RSA'))).toBe(true);
    }
    for (const key of jwks.keys) {
      expect(key.use ?? 'sig').toBe('sig');
      expect(key.kid).toEqual(expect.any(String));
      for (const secret of ['d', 'p', 'q', 'dp', 'dq', 'qi', 'k']) expect(key).not.toHaveProperty(secret);
    }
  });
});

describe('the authorization code flow with PKCE, driven by oauth4webapi', () => {
  it('signs alice in at the confidential app (client_secret_basic): state, iss, nonce and ID token pass', async () => {
    const { as, tokens, callback, claims } = await libraryFlow(confidential());
    expect(callback.searchParams.get('iss')).toBe(as.issuer);
    expect(claims?.iss).toBe(auth());
    expect(claims?.aud).toBe(whole.running.clients.app.clientId);
    expect(claims?.name).toEqual(expect.any(String));
    expect(tokens.token_type.toLowerCase()).toBe('bearer');
    expect(tokens.refresh_token).toEqual(expect.any(String));
    expect(tokens.expires_in).toBeGreaterThan(0);
    expect(tokens.expires_in).toBeLessThanOrEqual(300);
  });

  it('takes the secret in the body too (client_secret_post, advertised)', async () => {
    const { tokens } = await libraryFlow(confidential(oauth.ClientSecretPost(whole.running.clients.app.clientSecret)));
    expect(tokens.access_token).toEqual(expect.any(String));
  });

  it('signs in the public client (auth method none, advertised) with PKCE alone', async () => {
    const { tokens } = await libraryFlow(publicClient(), { scope: 'openid offline_access photos:read' });
    expect(tokens.refresh_token).toEqual(expect.any(String));
  });

  it('verifies the ID token on its own with jose against jwks_uri (signature, iss, aud, exp)', async () => {
    const { as, tokens } = await libraryFlow(confidential());
    const keys = createRemoteJWKSet(new URL(as.jwks_uri ?? ''));
    const { payload, protectedHeader } = await jwtVerify(tokens.id_token ?? '', keys, {
      issuer: as.issuer,
      audience: whole.running.clients.app.clientId,
      algorithms: as.id_token_signing_alg_values_supported ?? [],
    });
    expect(as.id_token_signing_alg_values_supported).toContain(protectedHeader.alg);
    expect(payload.sub).toEqual(expect.any(String));
  });

  it('refuses a callback whose state or iss is not the expected one (the library throws, no token asked)', async () => {
    const as = await discover();
    const rp = confidential();
    const good = new URL(rp.redirectUri);
    good.searchParams.set('code', 'x');
    good.searchParams.set('state', 'the-state');
    good.searchParams.set('iss', as.issuer);
    expect(() => oauth.validateAuthResponse(as, rp.client, good, 'another-state')).toThrow(/state/);
    const forged = new URL(good);
    forged.searchParams.set('iss', 'https://attacker.example');
    expect(() => oauth.validateAuthResponse(as, rp.client, forged, 'the-state')).toThrow(/iss/);
    const stripped = new URL(good);
    stripped.searchParams.delete('iss');
    expect(() => oauth.validateAuthResponse(as, rp.client, stripped, 'the-state')).toThrow(/iss/);
  });

  it('answers a denied or failed authorization with the error, state and iss, which the library reads', async () => {
    const as = await discover();
    const rp = confidential();
    const url = new URL(as.authorization_endpoint ?? '');
    url.searchParams.set('client_id', rp.client.client_id);
    url.searchParams.set('redirect_uri', rp.redirectUri);
    url.searchParams.set('response_type', 'code');
    url.searchParams.set('scope', 'openid');
    url.searchParams.set('state', 'st');
    url.searchParams.set('code_challenge', await oauth.calculatePKCECodeChallenge(oauth.generateRandomCodeVerifier()));
    url.searchParams.set('code_challenge_method', 'S256');
    url.searchParams.set('prompt', 'none');
    const response = await fetch(url, { redirect: 'manual' });
    expect(response.status).toBe(303);
    const callback = new URL(response.headers.get('location') ?? '');
    expect(callback.href.startsWith(rp.redirectUri)).toBe(true);
    const error = (() => {
      try {
        oauth.validateAuthResponse(as, rp.client, callback, 'st');
      } catch (thrown) {
        return thrown;
      }
    })();
    expect(error).toBeInstanceOf(oauth.AuthorizationResponseError);
    expect((error as oauth.AuthorizationResponseError).error).toBe('login_required');
  });
});

describe('refresh, revocation, introspection and UserInfo, through the library', () => {
  it('rotates the refresh token on every use, and a used one comes back invalid_grant', async () => {
    const rp = confidential();
    const { as, tokens, claims } = await libraryFlow(rp);
    const first = tokens.refresh_token ?? '';
    const refreshed = await oauth.processRefreshTokenResponse(
      as,
      rp.client,
      await oauth.refreshTokenGrantRequest(as, rp.client, rp.clientAuth, first, insecure),
    );
    expect(refreshed.refresh_token).toEqual(expect.any(String));
    expect(refreshed.refresh_token).not.toBe(first);
    // An ID token on refresh, when there is one, names the same user (checked by the library).
    if (refreshed.id_token) expect(oauth.getValidatedIdTokenClaims(refreshed)?.sub).toBe(claims?.sub);
    // Past the reuse interval (within it, a retry is answered once more: `refresh-reuse.int.test.ts`).
    await whole.db.query(
      `update idp_models set consumed_at = consumed_at - interval '1 hour' where model = 'RefreshToken' and id = $1`,
      [storedId('RefreshToken', first)],
    );
    const reused = oauth.processRefreshTokenResponse(
      as,
      rp.client,
      await oauth.refreshTokenGrantRequest(as, rp.client, rp.clientAuth, first, insecure),
    );
    await expect(reused).rejects.toMatchObject({ error: 'invalid_grant', status: 400 });
  });

  it('revokes a refresh token (RFC 7009) and introspection, by the confidential client, then says inactive', async () => {
    const rp = confidential();
    const { as, tokens } = await libraryFlow(rp);
    const refreshToken = tokens.refresh_token ?? '';
    const before = await oauth.processIntrospectionResponse(
      as,
      rp.client,
      await oauth.introspectionRequest(as, rp.client, rp.clientAuth, refreshToken, insecure),
    );
    expect(before.active).toBe(true);
    expect(before.client_id).toBe(rp.client.client_id);
    const revoked = await oauth.revocationRequest(as, rp.client, rp.clientAuth, refreshToken, insecure);
    await oauth.processRevocationResponse(revoked);
    const after = await oauth.processIntrospectionResponse(
      as,
      rp.client,
      await oauth.introspectionRequest(as, rp.client, rp.clientAuth, refreshToken, insecure),
    );
    expect(after.active).toBe(false);
  });

  it('calls UserInfo with the opaque token of a sign-in that asked for no API scope, and the library checks sub', async () => {
    const rp = confidential();
    const { as, tokens, claims } = await libraryFlow(rp, { scope: 'openid profile email', resource: undefined });
    const response = await oauth.userInfoRequest(as, rp.client, tokens.access_token, insecure);
    const userinfo = await oauth.processUserInfoResponse(as, rp.client, claims?.sub ?? '', response);
    expect(userinfo.sub).toBe(claims?.sub);
    expect(userinfo.email).toEqual(expect.any(String));
  });
});

/** What a library sees of a refusal: the challenges it parsed out of `WWW-Authenticate`, or the throw. */
async function challengesOf(request: Promise<Response>): Promise<oauth.WWWAuthenticateChallenge[]> {
  try {
    const response = await request;
    throw new Error(
      `no challenge the library could parse: ${response.status} ${response.headers.get('www-authenticate')}`,
    );
  } catch (error) {
    if (!(error instanceof oauth.WWWAuthenticateChallengeError)) throw error;
    return error.cause;
  }
}

describe('access tokens at independent resource servers and at the gateway', () => {
  it('passes jose on its own: RFC 9068 typ, issuer, the API audience, a key from jwks_uri', async () => {
    const { as, tokens } = await libraryFlow(confidential());
    const keys = createRemoteJWKSet(new URL(as.jwks_uri ?? ''));
    const { payload, protectedHeader } = await jwtVerify(tokens.access_token, keys, {
      issuer: as.issuer,
      audience: gateway(),
      typ: 'at+jwt',
      requiredClaims: ['sub', 'exp', 'iat', 'jti', 'client_id'],
    });
    expect(protectedHeader.typ).toBe('at+jwt');
    expect(payload.client_id).toBe(whole.running.clients.app.clientId);
    expect(String(payload.scope).split(' ')).toContain('photos:read');
    // Another audience, or the clock past exp, is refused by the same verifier.
    await expect(
      jwtVerify(tokens.access_token, keys, { audience: 'https://other-api.example' }),
    ).rejects.toBeInstanceOf(joseErrors.JWTClaimValidationFailed);
    const afterExpiry = new Date(((payload.exp ?? 0) + 1) * 1000);
    await expect(jwtVerify(tokens.access_token, keys, { currentDate: afterExpiry })).rejects.toBeInstanceOf(
      joseErrors.JWTExpired,
    );
  });

  it("passes oauth4webapi's resource-server check (validateJwtAccessToken, RFC 9068 in full)", async () => {
    const { as, tokens } = await libraryFlow(confidential());
    const request = new Request(`${gateway()}/photos`, { headers: { authorization: `Bearer ${tokens.access_token}` } });
    const claims = await oauth.validateJwtAccessToken(as, request, gateway(), insecure);
    expect(claims.client_id).toBe(whole.running.clients.app.clientId);
  });

  it('is taken by the gateway through protectedResourceRequest, and refused once the gateway clock passes exp', async () => {
    const { tokens } = await libraryFlow(confidential());
    const url = new URL('/photos', gateway());
    const ok = await oauth.protectedResourceRequest(tokens.access_token, 'GET', url, undefined, undefined, insecure);
    expect(ok.status).toBe(200);
    skewMs = (tokens.expires_in ?? 300) * 1000 + 60_000;
    try {
      const [challenge] = await challengesOf(
        oauth.protectedResourceRequest(tokens.access_token, 'GET', url, undefined, undefined, insecure),
      );
      expect(challenge?.scheme).toBe('bearer');
      expect(challenge?.parameters.error).toBe('invalid_token');
      expect(challenge?.parameters.error_description).toEqual(expect.any(String));
    } finally {
      skewMs = 0;
    }
  });
});

describe("the gateway's refusals, as a client library reads them (RFC 6750, RFC 9728)", () => {
  it('answers a missing token with a Bearer challenge without an error code, and the resource metadata URL', async () => {
    const response = await fetch(new URL('/photos', gateway()));
    expect(response.status).toBe(401);
    const challenges = await parse(response);
    const bearer = challenges.find((challenge) => challenge.scheme === 'bearer');
    expect(bearer).toBeDefined();
    // RFC 6750 section 3.1: a request with no authentication information gets no error code.
    expect(bearer?.parameters.error).toBeUndefined();
    expect(bearer?.parameters.resource_metadata).toBe(`${gateway()}/.well-known/oauth-protected-resource`);
  });

  // Was wrong: the 403 comes from the API or the receiver behind the gateway, whose challenges had the
  // guard's default realm ("api", the gateway's 401 says "reference-api") and no resource_metadata, so a
  // client told insufficient_scope could not find the metadata (RFC 9728) to step up with.
  it.each([
    ['the API', '/settings', 'settings:read'],
    ['the receiver', '/webhook-events', 'events:read'],
  ])(
    'answers a token without the scope (%s) with 403 insufficient_scope, the scope, and the 401s realm and metadata',
    async (_name, path, scope) => {
      const { tokens } = await libraryFlow(confidential());
      const response = await fetch(new URL(path, gateway()), {
        headers: { authorization: `Bearer ${tokens.access_token}` },
      });
      expect(response.status).toBe(403);
      const [challenge] = await parse(response);
      expect(challenge?.scheme).toBe('bearer');
      expect(challenge?.parameters.error).toBe('insufficient_scope');
      expect(challenge?.parameters.scope?.split(' ')).toContain(scope);
      const unauthenticated = await parse(await fetch(new URL(path, gateway())));
      const bearer401 = unauthenticated.find((c) => c.scheme === 'bearer');
      expect(challenge?.parameters.realm).toBe(bearer401?.parameters.realm);
      expect(challenge?.parameters.resource_metadata).toBe(`${gateway()}/.well-known/oauth-protected-resource`);
    },
  );

  it('leads a client from the resource_metadata of a 401 to the provider (RFC 9728), all through the library', async () => {
    const response = await fetch(new URL('/photos', gateway()), { headers: { authorization: 'Bearer not-a-token' } });
    const metadataUrl = (await parse(response)).find((c) => c.parameters.resource_metadata)?.parameters
      .resource_metadata;
    expect(metadataUrl).toBe(`${gateway()}/.well-known/oauth-protected-resource`);
    const resource = new URL(gateway());
    const metadata = await oauth.processResourceDiscoveryResponse(
      resource,
      await oauth.resourceDiscoveryRequest(resource, insecure),
    );
    expect(metadata.resource).toBe(gateway());
    expect(metadata.authorization_servers).toEqual([auth()]);
    const issuer = new URL(metadata.authorization_servers?.[0] ?? '');
    const as = await oauth.processDiscoveryResponse(issuer, await oauth.discoveryRequest(issuer, insecure));
    expect(as.issuer).toBe(auth());
    // What the resource says it takes, the provider can issue.
    for (const alg of metadata.dpop_signing_alg_values_supported ?? []) {
      expect(as.dpop_signing_alg_values_supported).toContain(alg);
    }
  });
});

/**
 * The challenges oauth4webapi parses out of `response`: the response is handed to the library's
 * protectedResourceRequest through its customFetch hook, so its own parser reads the header.
 */
function parse(response: Response): Promise<oauth.WWWAuthenticateChallenge[]> {
  return challengesOf(
    oauth.protectedResourceRequest('unused', 'GET', new URL(response.url || gateway()), undefined, undefined, {
      ...insecure,
      [oauth.customFetch]: async () => response,
    }),
  );
}

describe('DPoP (RFC 9449) as advertised, with the library making the proofs', () => {
  // Was wrong (EdDSA): oauth4webapi signs an Ed25519 key's proofs as RFC 9864's `Ed25519`; the provider
  // took only the name `EdDSA`, so the token request failed with invalid_dpop_proof.
  it.each([
    ['ES256', 'ES256'],
    ['EdDSA', 'Ed25519'],
  ] as const)(
    '%s: binds the tokens at the token endpoint, the gateway takes them with proofs, the refresh needs the key',
    async (alg, proofAlg) => {
      const rp = publicClient();
      const as = await discover();
      // The name the library writes into its proofs is one discovery lists.
      expect(as.dpop_signing_alg_values_supported).toContain(proofAlg);
      const keyPair = await oauth.generateKeyPair(alg);
      const dpop = oauth.DPoP(rp.client, keyPair);
      const { tokens } = await libraryFlow(rp, { scope: 'openid offline_access photos:read', dpop });
      expect(tokens.token_type.toLowerCase()).toBe('dpop');
      const url = new URL('/photos', gateway());
      const response = await oauth.protectedResourceRequest(tokens.access_token, 'GET', url, undefined, undefined, {
        ...insecure,
        DPoP: dpop,
      });
      expect(response.status).toBe(200);
      // The RS side of the library checks the binding too.
      const request = new Request(url, {
        headers: {
          authorization: `DPoP ${tokens.access_token}`,
          dpop: await proofFor(keyPair, proofAlg, 'GET', url, tokens.access_token),
        },
      });
      await oauth.validateJwtAccessToken(as, request, gateway(), insecure);
      const refreshed = await oauth.processRefreshTokenResponse(
        as,
        rp.client,
        await oauth.refreshTokenGrantRequest(as, rp.client, rp.clientAuth, tokens.refresh_token ?? '', {
          ...insecure,
          DPoP: dpop,
        }),
      );
      expect(refreshed.token_type.toLowerCase()).toBe('dpop');
    },
  );

  it('binds the confidential app too when it sends a proof, and the gateway asks the DPoP scheme for it', async () => {
    const rp = confidential();
    const keyPair = await oauth.generateKeyPair('ES256');
    const dpop = oauth.DPoP(rp.client, keyPair);
    const { tokens } = await libraryFlow(rp, { dpop });
    const url = new URL('/photos', gateway());
    const asBearer = await fetch(url, { headers: { authorization: `Bearer ${tokens.access_token}` } });
    expect(asBearer.status).toBe(401);
    const challenges = await parse(asBearer);
    expect(challenges.some((challenge) => challenge.scheme === 'dpop')).toBe(true);
  });
});

/** A DPoP proof made by hand (jose) with the library's key pair, for validateJwtAccessToken's request. */
async function proofFor(keyPair: CryptoKeyPair, alg: string, htm: string, htu: URL, accessToken: string) {
  const { SignJWT, exportJWK } = await import('jose');
  const { createHash, randomUUID } = await import('node:crypto');
  const { kty, crv, x, y } = await exportJWK(keyPair.publicKey);
  const jwk = Object.fromEntries(Object.entries({ kty, crv, x, y }).filter(([, v]) => v !== undefined));
  return new SignJWT({
    htm,
    htu: htu.href,
    jti: randomUUID(),
    ath: createHash('sha256').update(accessToken).digest('base64url'),
  })
    .setProtectedHeader({ alg, typ: 'dpop+jwt', jwk })
    .setIssuedAt()
    .sign(keyPair.privateKey);
}

/** The OAuth error a library reads off a token-endpoint style response, with the status and headers. */
async function oauthError(response: Response) {
  const headers = response.headers;
  try {
    await oauth.processRevocationResponse(response);
  } catch (error) {
    if (error instanceof oauth.ResponseBodyError) {
      return { status: error.status, error: error.error, description: error.error_description, headers };
    }
    if (error instanceof oauth.WWWAuthenticateChallengeError) {
      // A 401 with a challenge: the library reads the error from the challenge, not the body.
      const [challenge] = error.cause;
      return {
        status: error.status,
        error: challenge?.parameters.error,
        description: challenge?.parameters.error_description,
        headers,
      };
    }
    throw error;
  }
  throw new Error(`not an error: ${response.status}`);
}

describe("the provider's errors for the mistakes a client library makes (RFC 6749 section 5.2)", () => {
  const form = (fields: Record<string, string>, headers: Record<string, string> = {}) => ({
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body: new URLSearchParams(fields),
  });
  const basic = (id: string, secret: string) => ({
    authorization: `Basic ${Buffer.from(`${encodeURIComponent(id)}:${encodeURIComponent(secret)}`).toString('base64')}`,
  });
  const tokenUrl = () => new URL('/token', auth());

  it('answers each with 400/401, a JSON error and description, and Cache-Control: no-store', async () => {
    const { clientId, clientSecret, redirectUri } = whole.running.clients.app;
    const good = basic(clientId, clientSecret);
    const code = {
      grant_type: 'authorization_code',
      code: 'not-a-code',
      redirect_uri: redirectUri,
      code_verifier: 'v'.repeat(43),
    };
    const cases: Array<[string, RequestInit, number, string]> = [
      ['a code that is not one', form(code, good), 400, 'invalid_grant'],
      [
        'a refresh token that is not one',
        form({ grant_type: 'refresh_token', refresh_token: 'x' }, good),
        400,
        'invalid_grant',
      ],
      ['no grant_type', form({}, good), 400, 'invalid_request'],
      [
        'a grant nobody registered (client_credentials)',
        form({ grant_type: 'client_credentials' }, good),
        400,
        'unsupported_grant_type',
      ],
      [
        'the password grant',
        form({ grant_type: 'password', username: 'alice', password: 'x' }, good),
        400,
        'unsupported_grant_type',
      ],
      [
        'a JSON body',
        { method: 'POST', headers: { 'content-type': 'application/json', ...good }, body: '{}' },
        400,
        'invalid_request',
      ],
      [
        'the wrong secret in the body',
        form({ ...code, client_id: clientId, client_secret: 'wrong' }),
        401,
        'invalid_client',
      ],
      ['an unknown client', form(code, basic('nobody', 'x')), 401, 'invalid_client'],
    ];
    for (const [name, init, status, error] of cases) {
      const response = await fetch(tokenUrl(), init);
      expect(response.headers.get('content-type'), name).toMatch(/^application\/json/);
      expect(response.headers.get('cache-control'), name).toBe('no-store');
      const read = await oauthError(response);
      expect([read.status, read.error], name).toEqual([status, error]);
      expect(read.description, name).toEqual(expect.any(String));
    }
  });

  it('answers the wrong secret in Basic with 401 and a Basic challenge (RFC 6749 section 5.2 MUST)', async () => {
    const { clientId, redirectUri } = whole.running.clients.app;
    const response = await fetch(
      tokenUrl(),
      form({ grant_type: 'authorization_code', code: 'x', redirect_uri: redirectUri }, basic(clientId, 'wrong')),
    );
    expect(response.status).toBe(401);
    expect(response.headers.get('www-authenticate')).toMatch(/^Basic realm="[^"]+"/);
    expect(((await response.json()) as { error: string }).error).toBe('invalid_client');
  });

  // Was wrong: a request that sends no client authentication at all (a library set up with
  // oauth.None() by mistake) got 400 invalid_request "no client authentication mechanism provided",
  // oidc-provider's own answer; RFC 6749 section 5.2 names this case for invalid_client ("no client
  // authentication included"). A provider middleware now answers 401 invalid_client with a Basic
  // challenge, at the token endpoint and at introspection.
  it('answers a request with no client authentication at all with 401 invalid_client and a challenge', async () => {
    const { redirectUri } = whole.running.clients.app;
    const as = await discover();
    for (const [url, params] of [
      [tokenUrl(), { grant_type: 'authorization_code', code: 'x', redirect_uri: redirectUri }],
      [as.introspection_endpoint ?? '', { token: 'x' }],
    ] as const) {
      const where = String(url);
      const response = await fetch(url, form(params));
      expect(response.status, where).toBe(401);
      expect(response.headers.get('www-authenticate'), where).toMatch(/^Basic realm="[^"]+", error="invalid_client"/);
      expect((await oauthError(response)).error, where).toBe('invalid_client');
    }
  });

  it('answers UserInfo without a token with a bare challenge, and with a bad one invalid_token (RFC 6750)', async () => {
    const as = await discover();
    const userinfo = as.userinfo_endpoint ?? '';
    const none = await parse(await fetch(userinfo));
    expect(none.find((c) => c.scheme === 'bearer')?.parameters.error).toBeUndefined();
    const bad = await parse(await fetch(userinfo, { headers: { authorization: 'Bearer not-a-token' } }));
    expect(bad.find((c) => c.scheme === 'bearer')?.parameters.error).toBe('invalid_token');
  });

  it('answers introspection and revocation without client authentication with an error, never the token', async () => {
    const as = await discover();
    for (const endpoint of [as.introspection_endpoint, as.revocation_endpoint]) {
      const response = await fetch(endpoint ?? '', form({ token: 'x' }));
      const read = await oauthError(response);
      expect(read.status).toBeGreaterThanOrEqual(400);
      expect(read.status).toBeLessThan(500);
      expect(read.error).toEqual(expect.any(String));
    }
  });

  // Was wrong: introspecting the API access token (a JWT) by the client it was issued to answered 400
  // unsupported_token_type, an error RFC 7662 does not have; RFC 7662 section 2.2 answers a token the
  // server will not describe with 200 {"active": false}, so oauth4webapi (and any RFC 7662 client)
  // threw instead. oidc-provider refuses to introspect JWTs it issued; a provider middleware
  // (src/idp/jwt-introspection.ts) now verifies them and describes them.
  it('introspects the JWT access token as RFC 7662 says: a 200 the library reads, with the token described', async () => {
    const rp = confidential();
    const { as, tokens } = await libraryFlow(rp);
    const result = await introspect(as, rp, tokens.access_token);
    const claims = decodeJwt(tokens.access_token);
    expect(result).toEqual({
      active: true,
      client_id: rp.client.client_id,
      sub: 'user-alice',
      scope: claims.scope,
      aud: gateway(),
      iss: auth(),
      exp: claims.exp,
      iat: claims.iat,
      jti: claims.jti,
      token_type: 'Bearer',
    });
    expect(String(result.scope).split(' ')).toContain('photos:read');
  });

  it('introspects a DPoP-bound JWT access token as DPoP, with its key thumbprint (RFC 9449 section 6.2)', async () => {
    const rp = confidential();
    const keyPair = await oauth.generateKeyPair('ES256');
    const { as, tokens } = await libraryFlow(rp, { dpop: oauth.DPoP(rp.client, keyPair) });
    const jkt = (decodeJwt(tokens.access_token).cnf as { jkt: string }).jkt;
    const result = await introspect(as, rp, tokens.access_token);
    expect(result).toMatchObject({ active: true, token_type: 'DPoP', cnf: { jkt } });
  });

  it('tells another client, even an authenticated one, nothing about the JWT: active false', async () => {
    const rp = confidential();
    const { as, tokens } = await libraryFlow(rp);
    const other = { client_id: 'rp-interop-other', client_secret: 'rp-interop-other-secret-0123456789' };
    await saveClient(whole.db, {
      ...other,
      redirect_uris: ['http://127.0.0.1:4400/callback'],
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    });
    const stranger = {
      ...rp,
      client: { client_id: other.client_id },
      clientAuth: oauth.ClientSecretBasic(other.client_secret),
    };
    expect(await introspect(as, stranger, tokens.access_token)).toEqual({ active: false });
    // The public client proves nothing with its client_id: not even its own JWT is described to it.
    const cli = publicClient();
    const own = await libraryFlow(cli, { scope: 'openid offline_access photos:read' });
    expect(await introspect(as, cli, own.tokens.access_token)).toEqual({ active: false });
  });

  it('answers active false for a JWT that is expired, signed by another key, tampered with or not an access token', async () => {
    const rp = confidential();
    const { as, tokens } = await libraryFlow(rp);
    const real = decodeJwt(tokens.access_token);
    const header = decodeProtectedHeader(tokens.access_token);
    const [providerKey] = await loadSigningKeys(whole.db);
    const signingKey = await importJWK(providerKey as Parameters<typeof importJWK>[0], 'RS256');
    const now = Math.floor(Date.now() / 1000);
    const sign = (payload: JWTPayload, key: Parameters<SignJWT['sign']>[0] = signingKey, typ = 'at+jwt') =>
      new SignJWT(payload).setProtectedHeader({ alg: 'RS256', kid: header.kid, typ }).sign(key);
    // The provider's own key, the real claims: described while it lives, within the gateway's 5 s tolerance.
    const fresh = await sign({ ...real, iat: now - 290, exp: now - 2 });
    expect(await introspect(as, rp, fresh)).toMatchObject({ active: true, jti: real.jti });
    const [header64, payload64, signature64] = tokens.access_token.split('.');
    const tampered = { ...real, scope: `${real.scope} photos:write` };
    const cases: Array<[string, string]> = [
      ['expired a minute ago', await sign({ ...real, iat: now - 360, exp: now - 60 })],
      ['not valid yet', await sign({ ...real, nbf: now + 60 })],
      ['signed by another key under the same kid', await sign(real, (await generateKeyPair('RS256')).privateKey)],
      ['tampered with', `${header64}.${Buffer.from(JSON.stringify(tampered)).toString('base64url')}.${signature64}`],
      ['issued by another issuer', await sign({ ...real, iss: 'http://evil.example' })],
      ['typed as an ID token', await sign(real, signingKey, 'JWT')],
      ['an ID token of the provider', tokens.id_token ?? ''],
      ['not a JWS at all', `${header64}.${payload64}`],
    ];
    for (const [name, token] of cases) {
      expect(await introspect(as, rp, token), name).toEqual({ active: false });
    }
  });

  it('describes the JWT in JSON whatever the Accept, and leaves the other refusals of the provider as they were', async () => {
    const rp = confidential();
    const { as, tokens } = await libraryFlow(rp);
    const { clientId, clientSecret } = whole.running.clients.app;
    const basic = Buffer.from(`${encodeURIComponent(clientId)}:${encodeURIComponent(clientSecret)}`).toString('base64');
    const post = (body: URLSearchParams, accept: string) =>
      fetch(as.introspection_endpoint ?? '', {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Basic ${basic}`, accept },
        body,
      });
    // A client that prefers HTML would have got the provider's error page; the answer is JSON all the same.
    const html = await post(new URLSearchParams({ token: tokens.access_token }), 'text/html');
    expect(html.status).toBe(200);
    expect(html.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(html.headers.get('cache-control')).toBe('no-store');
    expect(await html.json()).toMatchObject({ active: true, client_id: clientId });
    // A parameter sent twice is the provider's invalid_request, JWT or not.
    const twice = new URLSearchParams({ token: tokens.access_token, token_type_hint: 'access_token' });
    twice.append('token_type_hint', 'access_token');
    const repeated = await post(twice, 'application/json');
    expect(repeated.status).toBe(400);
    expect(((await repeated.json()) as { error: string }).error).toBe('invalid_request');
  });

  it('refuses to revoke the JWT access token with unsupported_token_type, the RFC 7009 answer', async () => {
    const rp = confidential();
    const { as, tokens } = await libraryFlow(rp);
    const response = await oauth.revocationRequest(as, rp.client, rp.clientAuth, tokens.access_token, insecure);
    await expect(oauth.processRevocationResponse(response)).rejects.toMatchObject({ error: 'unsupported_token_type' });
  });
});

describe('the rest of what discovery advertises', () => {
  it('runs the flow through a pushed authorization request (RFC 9126), made by the library', async () => {
    const rp = confidential();
    const as = await discover();
    const verifier = oauth.generateRandomCodeVerifier();
    const state = oauth.generateRandomState();
    const params = new URLSearchParams({
      redirect_uri: rp.redirectUri,
      response_type: 'code',
      scope: 'openid photos:read',
      state,
      resource: gateway(),
      code_challenge: await oauth.calculatePKCECodeChallenge(verifier),
      code_challenge_method: 'S256',
    });
    const pushed = await oauth.processPushedAuthorizationResponse(
      as,
      rp.client,
      await oauth.pushedAuthorizationRequest(as, rp.client, rp.clientAuth, params, insecure),
    );
    const url = new URL(as.authorization_endpoint ?? '');
    url.searchParams.set('client_id', rp.client.client_id);
    url.searchParams.set('request_uri', pushed.request_uri);
    const callback = await loginAndConsent(createUserAgent(), auth(), url.href, rp.redirectUri, alice);
    const code = oauth.validateAuthResponse(as, rp.client, callback, state);
    const tokens = await oauth.processAuthorizationCodeResponse(
      as,
      rp.client,
      await oauth.authorizationCodeGrantRequest(as, rp.client, rp.clientAuth, code, rp.redirectUri, verifier, insecure),
    );
    expect(tokens.access_token).toEqual(expect.any(String));
  });

  it('answers response_mode=fragment (advertised) in the fragment, with state and iss', async () => {
    const rp = confidential();
    const as = await discover();
    const verifier = oauth.generateRandomCodeVerifier();
    const url = new URL(as.authorization_endpoint ?? '');
    for (const [name, value] of Object.entries({
      client_id: rp.client.client_id,
      redirect_uri: rp.redirectUri,
      response_type: 'code',
      response_mode: 'fragment',
      scope: 'openid',
      state: 'frag-state',
      code_challenge: await oauth.calculatePKCECodeChallenge(verifier),
      code_challenge_method: 'S256',
    })) {
      url.searchParams.set(name, value);
    }
    const callback = await loginAndConsent(createUserAgent(), auth(), url.href, rp.redirectUri, alice);
    expect(callback.search).toBe('');
    const fragment = new URLSearchParams(callback.hash.slice(1));
    const code = oauth.validateAuthResponse(as, rp.client, fragment, 'frag-state');
    const tokens = await oauth.processAuthorizationCodeResponse(
      as,
      rp.client,
      await oauth.authorizationCodeGrantRequest(as, rp.client, rp.clientAuth, code, rp.redirectUri, verifier, insecure),
    );
    expect(tokens.id_token).toEqual(expect.any(String));
  });

  it('ends the session at end_session_endpoint with id_token_hint, post_logout_redirect_uri and state (RP-Initiated Logout)', async () => {
    const rp = confidential();
    const agent = createUserAgent();
    const as = await discover();
    // Signed in at the provider in this browser.
    const verifier = oauth.generateRandomCodeVerifier();
    const start = new URL(as.authorization_endpoint ?? '');
    for (const [name, value] of Object.entries({
      client_id: rp.client.client_id,
      redirect_uri: rp.redirectUri,
      response_type: 'code',
      scope: 'openid',
      state: 's',
      code_challenge: await oauth.calculatePKCECodeChallenge(verifier),
      code_challenge_method: 'S256',
    })) {
      start.searchParams.set(name, value);
    }
    const callback = await loginAndConsent(agent, auth(), start.href, rp.redirectUri, alice);
    const tokens = await oauth.processAuthorizationCodeResponse(
      as,
      rp.client,
      await oauth.authorizationCodeGrantRequest(
        as,
        rp.client,
        rp.clientAuth,
        oauth.validateAuthResponse(as, rp.client, callback, 's'),
        rp.redirectUri,
        verifier,
        insecure,
      ),
    );
    const postLogout = new URL('/', rp.redirectUri).href;
    const end = new URL(as.end_session_endpoint ?? '');
    end.searchParams.set('id_token_hint', tokens.id_token ?? '');
    end.searchParams.set('post_logout_redirect_uri', postLogout);
    end.searchParams.set('state', 'bye');
    const confirm = await agent.request(end.href);
    expect(confirm.response.status).toBe(200);
    const action = /<form id="op.logoutForm" method="post" action="([^"]+)"/.exec(confirm.body)?.[1] ?? '';
    const xsrf = /name="xsrf" value="([^"]+)"/.exec(confirm.body)?.[1] ?? '';
    const done = await agent.postForm(new URL(action, end).href, { xsrf, logout: 'yes' });
    expect(done.response.status).toBe(303);
    const back = new URL(done.response.headers.get('location') ?? '', end);
    expect(`${back.origin}${back.pathname}`).toBe(postLogout);
    expect(back.searchParams.get('state')).toBe('bye');
    // Signed out at the provider: prompt=none now answers login_required.
    start.searchParams.set('prompt', 'none');
    const again = await agent.request(start.href);
    expect(new URL(again.response.headers.get('location') ?? '').searchParams.get('error')).toBe('login_required');
  });
});
