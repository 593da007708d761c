// The third-party app's protocol client against a scripted authorization server: what a real provider
// never sends (a forged ID token signature, a wrong nonce, alg none, a lying discovery document) must
// be refused (rows 34 and 36; ID token signature, which oauth4webapi skips unless asked).
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterAll, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { createOidcClient, type OidcClient } from '../src/app/oidc-client.js';

type Mode = 'good' | 'wrong-key' | 'wrong-nonce' | 'alg-none' | 'wrong-issuer-discovery';

let server: Server;
let issuer: string;
let mode: Mode = 'good';
/**
 * What the scripted ID token changes before it is signed, a member set to undefined removed: the
 * client's check of each claim and header member.
 */
interface Patch {
  claims?: Record<string, unknown>;
  header?: { alg?: string; kid?: string | undefined };
}
let patch: Patch = {};
let hmacKey: Uint8Array;
let expectedNonce = '';
let tokenRequests = 0;
let signingKey: CryptoKey;
let otherKey: CryptoKey;
let publicJwk: Record<string, unknown>;
let otherPublicJwk: Record<string, unknown>;
/** Keys the scripted provider publishes beside `publicJwk`: a key rotation's new key. */
let publishedToo: Record<string, unknown>[] = [];

const unsigned = (payload: Record<string, unknown>) =>
  `${Buffer.from(JSON.stringify({ alg: 'none', typ: 'JWT' })).toString('base64url')}.${Buffer.from(JSON.stringify(payload)).toString('base64url')}.`;

beforeAll(async () => {
  const a = await generateKeyPair('RS256');
  const b = await generateKeyPair('RS256');
  signingKey = a.privateKey;
  otherKey = b.privateKey;
  hmacKey = new TextEncoder().encode('secret');
  publicJwk = { ...(await exportJWK(a.publicKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
  otherPublicJwk = { ...(await exportJWK(b.publicKey)), kid: 'k2', alg: 'RS256', use: 'sig' };

  server = createServer(async (req, res) => {
    const json = (value: unknown) =>
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(value));
    if (req.url === '/.well-known/openid-configuration') {
      return json({
        issuer: mode === 'wrong-issuer-discovery' ? 'https://someone-else.example' : issuer,
        authorization_endpoint: `${issuer}/auth`,
        token_endpoint: `${issuer}/token`,
        jwks_uri: `${issuer}/jwks`,
        revocation_endpoint: `${issuer}/revoke`,
        authorization_response_iss_parameter_supported: true,
        id_token_signing_alg_values_supported: ['RS256'],
      });
    }
    if (req.url === '/jwks') return json({ keys: [publicJwk, ...publishedToo] });
    if (req.url === '/token') {
      tokenRequests++;
      const now = Math.floor(Date.now() / 1000);
      const claims: Record<string, unknown> = {
        iss: issuer,
        aud: 'photo-app',
        sub: 'user-1',
        name: 'Test User',
        iat: now,
        exp: now + 300,
        nonce: mode === 'wrong-nonce' ? 'not-the-nonce' : expectedNonce,
      };
      const header: Record<string, unknown> = { alg: 'RS256', kid: 'k1' };
      for (const [target, changes] of [
        [claims, patch.claims],
        [header, patch.header],
      ] as const) {
        for (const [name, value] of Object.entries(changes ?? {})) {
          if (value === undefined) delete target[name];
          else target[name] = value;
        }
      }
      const idToken =
        mode === 'alg-none'
          ? unsigned(claims)
          : await new SignJWT(claims)
              .setProtectedHeader(header as { alg: string })
              .sign(header.alg === 'HS256' ? hmacKey : mode === 'wrong-key' ? otherKey : signingKey);
      return json({ access_token: 'opaque-at', token_type: 'Bearer', expires_in: 300, id_token: idToken });
    }
    res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  issuer = `http://localhost:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
});

beforeEach(() => {
  mode = 'good';
  patch = {};
  publishedToo = [];
  tokenRequests = 0;
});

const client = (maxAgeSeconds?: number): OidcClient =>
  createOidcClient({
    maxAgeSeconds,
    issuer,
    clientId: 'photo-app',
    clientSecret: 'secret',
    redirectUri: 'http://localhost:1/callback',
    resource: 'http://localhost:8080',
    scope: 'openid',
    now: Date.now,
  });

async function attempt(oidc: OidcClient) {
  const { pending } = await oidc.startSignIn('/');
  expectedNonce = pending.nonce;
  const callback = new URL('http://localhost:1/callback');
  callback.searchParams.set('code', 'code-1');
  callback.searchParams.set('state', pending.state);
  callback.searchParams.set('iss', issuer);
  return oidc.finishSignIn(callback, pending);
}

describe('the app protocol client against a scripted server', () => {
  it('accepts a properly signed ID token with the right nonce', async () => {
    const result = await attempt(client());
    expect(result.user).toEqual({ sub: 'user-1', name: 'Test User' });
    expect(result.tokens.accessToken).toBe('opaque-at');
  });

  it('refuses an ID token signed with a key that is not in the JWKS', async () => {
    mode = 'wrong-key';
    await expect(attempt(client())).rejects.toThrow();
  });

  it('refuses an unsigned (alg none) ID token', async () => {
    mode = 'alg-none';
    await expect(attempt(client())).rejects.toThrow();
  });

  it('refuses an ID token whose nonce is not the stored one (row 34)', async () => {
    mode = 'wrong-nonce';
    await expect(attempt(client())).rejects.toThrow(/nonce/);
  });

  it('refuses a discovery document whose issuer is not the configured one (row 36)', async () => {
    mode = 'wrong-issuer-discovery';
    await expect(client().startSignIn('/')).rejects.toThrow(/issuer/);
    expect(tokenRequests).toBe(0);
  });

  // What oauth4webapi checks in processAuthorizationCodeResponse, pinned through the app's client: a
  // release, or a change of options (a clockTolerance, a skipped check), that let any through fails here.
  const now = () => Math.floor(Date.now() / 1000);
  it.each<[string, Patch, RegExp]>([
    ['for another client (aud)', { claims: { aud: 'other-app' } }, /"aud"/],
    [
      'with another audience beside the app, and no azp',
      { claims: { aud: ['photo-app', 'other-app'] } },
      /additional untrusted audiences/,
    ],
    ['authorized for another party (azp)', { claims: { aud: ['photo-app', 'other-app'], azp: 'other-app' } }, /"azp"/],
    ['past its exp', { claims: { exp: now() - 120 } }, /"exp".*past/],
    ['without exp', { claims: { exp: undefined } }, /"exp".*missing/],
    ['without iat', { claims: { iat: undefined } }, /"iat".*missing/],
    ['from another issuer (iss)', { claims: { iss: 'https://someone-else.example' } }, /"iss"/],
    ['without sub', { claims: { sub: undefined } }, /"sub".*missing/],
    ['without the nonce it was sent (row 34)', { claims: { nonce: undefined } }, /"nonce".*missing/],
    [
      'signed HS256 with the client secret, not the RS256 the client registered',
      { header: { alg: 'HS256', kid: undefined } },
      /"alg" header/,
    ],
    ['naming a key the JWKS does not hold (kid)', { header: { kid: 'k-unknown' } }, /no applicable keys/],
  ])('refuses an ID token %s, and signs no one in', async (_name, change, message) => {
    patch = change;
    await expect(attempt(client())).rejects.toThrow(message);
  });

  it.each<[string, Patch]>([
    ['without auth_time', {}],
    ['whose auth_time is older than max_age', { claims: { auth_time: now() - 3600 } }],
  ])('refuses an ID token %s when the app sends max_age', async (_name, change) => {
    patch = change;
    await expect(attempt(client(600))).rejects.toThrow(/auth_time|since the last End-User authentication/);
  });

  it('pins: takes an ID token whose auth_time is within max_age (the contrast)', async () => {
    const authTime = now() - 60;
    patch = { claims: { auth_time: authTime } };
    const result = await attempt(client(600));
    expect(result.authTime).toBe(authTime);
  });

  it("takes a key the provider published after the client read its JWKS, once the client's copy is a minute old (key rotation)", async () => {
    // docs/operations.md: a new signing key is published 5 minutes before it signs, since a relying
    // party on oauth4webapi reads the JWKS again for an unknown kid only once its copy is 60 s old.
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      const oidc = client();
      await attempt(oidc);
      publishedToo = [otherPublicJwk];
      mode = 'wrong-key';
      patch = { header: { kid: 'k2' } };
      await expect(attempt(oidc)).rejects.toThrow(/no applicable keys/);
      vi.setSystemTime(Date.now() + 61_000);
      expect((await attempt(oidc)).user?.sub).toBe('user-1');
    } finally {
      vi.useRealTimers();
    }
  });

  it.each(['http://idp.example', 'http://127.0.0.1.evil.example', 'http://localhost.evil.example'])(
    'refuses a plain-http issuer that is not loopback (%s) before any request (pitfall 7)',
    async (httpIssuer) => {
      const oidc = createOidcClient({
        issuer: httpIssuer,
        clientId: 'photo-app',
        clientSecret: 'secret',
        redirectUri: 'http://localhost:1/callback',
        resource: 'http://localhost:8080',
        scope: 'openid',
        now: Date.now,
      });
      await expect(oidc.startSignIn('/')).rejects.toThrow(/HTTPS/);
    },
  );
});
