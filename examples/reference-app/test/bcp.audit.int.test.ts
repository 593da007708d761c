// RFC 9700 (OAuth 2.0 Security BCP) and OpenID Connect Core, walked against the whole running app: the
// provider, the gateway in front of the API, the public and the confidential client. The rows the other
// files pin (redirect URI matching, PKCE, code replay, rotation, logout, framing) are not repeated here.
import { createHash, randomUUID } from 'node:crypto';
import { calculateJwkThumbprint, exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { createIdp } from '../src/idp/server.js';
import { storedId } from '../src/idp/stored-id.js';
import { listen } from '../src/listen.js';
import { authorizationUrl, type Credentials, codeFlow, loginAndConsent, tokenRequest } from './flow.js';
import { alice } from './test-idp.js';
import { startWholeStack, type WholeStack } from './test-stack.js';
import { createUserAgent, decodeJwt, formAction, formField, pkcePair } from './user-agent.js';

let whole: WholeStack;
let app: Required<Credentials>;
let cli: Credentials;
const auth = () => whole.running.authUrl;
const gateway = () => whole.stack.gateway.url;

beforeAll(async () => {
  whole = await startWholeStack('bcp');
  app = { ...whole.running.clients.app };
  // A native public client may use any loopback port (RFC 8252 section 7.3).
  cli = { clientId: whole.running.clients.publicClient.clientId, redirectUri: 'http://127.0.0.1:4321/callback' };
});

afterAll(async () => {
  await whole?.close();
});

const refresh = (token: string, client: Credentials, extra: Record<string, string> = {}) =>
  tokenRequest(auth(), { grant_type: 'refresh_token', refresh_token: token, ...extra }, client);

/** Moves the first use of a refresh token past the reuse interval, as waiting would. */
const usedLongAgo = (token: string) =>
  whole.db.query(
    `update idp_models set consumed_at = consumed_at - interval '1 hour' where model = 'RefreshToken' and id = $1`,
    [storedId('RefreshToken', token)],
  );

describe('a refresh refused for its resource indicator (RFC 8707) leaves the refresh token as it was', () => {
  it.each([
    ['the confidential app', () => app, undefined],
    ['the public client', () => cli, 'openid offline_access photos:read'],
  ])(
    '%s: a mistyped resource is invalid_target, and the same refresh token then still works',
    async (_name, client, scope) => {
      const { tokens } = await codeFlow(auth(), client(), alice, scope ? { scope } : {});
      const refreshToken = tokens.body.refresh_token as string;
      // The API with a trailing slash: not the resource indicator the grant holds.
      const refused = await refresh(refreshToken, client(), { resource: `${whole.stack.gateway.baseUrl}/` });
      expect(refused.status).toBe(400);
      expect(refused.body.error).toBe('invalid_target');
      // Was wrong: oidc-provider consumed (rotated) the refresh token before it resolved the resource, so
      // the refused request used it up without handing out the new one; the client's next refresh, with
      // the only token it has, looked like reuse and revoked the whole grant.
      const next = await refresh(refreshToken, client());
      expect(next.status).toBe(200);
      expect(decodeJwt(next.body.access_token).payload.aud).toBe(whole.stack.gateway.baseUrl);
      // Naming the granted resource, as RFC 8707 allows, refreshes as before.
      const named = await refresh(next.body.refresh_token, client(), { resource: whole.stack.gateway.baseUrl });
      expect(named.status).toBe(200);
    },
  );

  /** alice signs in twice in one browser (one grant at the provider); the second sign-in's code, unredeemed. */
  async function secondSignIn(extra: Record<string, string> = {}) {
    const first = await codeFlow(auth(), app, alice);
    const { verifier, challenge } = pkcePair();
    const callback = await loginAndConsent(
      first.agent,
      auth(),
      authorizationUrl(auth(), {
        clientId: app.clientId,
        redirectUri: app.redirectUri,
        challenge,
        challengeMethod: 'S256',
      }),
      app.redirectUri,
      alice,
    );
    const redeem = (extra: Record<string, string> = {}) =>
      tokenRequest(
        auth(),
        {
          grant_type: 'authorization_code',
          code: callback.searchParams.get('code') ?? '',
          redirect_uri: app.redirectUri,
          code_verifier: verifier,
          ...extra,
        },
        app,
      );
    // The same redemption as a form, for requests `tokenRequest` cannot make (a repeated `resource`).
    const body = new URLSearchParams({
      grant_type: 'authorization_code',
      code: callback.searchParams.get('code') ?? '',
      redirect_uri: app.redirectUri,
      code_verifier: verifier,
      ...extra,
    });
    return { firstRefreshToken: first.tokens.body.refresh_token as string, redeem, body };
  }

  /** A token request from the confidential app, answered as it came (status, headers, body). */
  const postToken = (body: URLSearchParams) =>
    fetch(new URL('/token', auth()), {
      method: 'POST',
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        authorization: `Basic ${Buffer.from(`${encodeURIComponent(app.clientId)}:${encodeURIComponent(app.clientSecret)}`).toString('base64')}`,
      },
      body,
    });

  it('pins: a second sign-in in the same browser leaves the first one refreshing (the contrast)', async () => {
    const { firstRefreshToken, redeem } = await secondSignIn();
    expect((await redeem()).status).toBe(200);
    expect((await refresh(firstRefreshToken, app)).status).toBe(200);
  });

  // Was wrong: at the token endpoint, oidc-provider consumes the code before it resolves `resource`, so
  // a redemption refused with invalid_target used the code up. The corrected retry was then a second
  // redemption, which revoked the whole grant: the browser's earlier sign-in stopped refreshing too.
  // The resource is now checked ahead of oidc-provider's grant handler (src/idp/code-resource.ts).
  it('a code redemption refused for its resource leaves the code, and the grant, as they were', async () => {
    const { firstRefreshToken, redeem } = await secondSignIn();
    const refused = await redeem({ resource: `${whole.stack.gateway.baseUrl}/` });
    expect(refused.body.error).toBe('invalid_target');
    const retried = await redeem();
    expect(retried.status).toBe(200);
    expect(decodeJwt(retried.body.access_token).payload.aud).toBe(whole.stack.gateway.baseUrl);
    expect((await refresh(firstRefreshToken, app)).status).toBe(200);
  });

  it('answers the refused redemption as oidc-provider did: 400 invalid_target, JSON, no-store', async () => {
    const { body } = await secondSignIn({ resource: `${whole.stack.gateway.baseUrl}/` });
    const response = await postToken(body);
    expect(response.status).toBe(400);
    expect(response.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(response.headers.get('cache-control')).toBe('no-store');
    expect(await response.json()).toEqual({
      error: 'invalid_target',
      error_description: 'resource indicator is missing, or unknown',
    });
  });

  it('redeems a code that names the granted resource, alone or among others (the API is the one picked)', async () => {
    for (const resources of [
      [whole.stack.gateway.baseUrl],
      [`${whole.stack.gateway.baseUrl}/`, whole.stack.gateway.baseUrl],
    ]) {
      const { body } = await secondSignIn();
      for (const resource of resources) body.append('resource', resource);
      const response = await postToken(body);
      expect(response.status, resources.join(' ')).toBe(200);
      const tokens = (await response.json()) as { access_token: string };
      expect(decodeJwt(tokens.access_token).payload.aud).toBe(whole.stack.gateway.baseUrl);
    }
  });

  it('pins: a used code presented again with a wrong resource still revokes the grant (replay comes first)', async () => {
    const { firstRefreshToken, redeem } = await secondSignIn();
    expect((await redeem()).status).toBe(200);
    const replay = await redeem({ resource: `${whole.stack.gateway.baseUrl}/` });
    expect(replay.body.error).toBe('invalid_grant');
    expect((await refresh(firstRefreshToken, app)).body.error).toBe('invalid_grant');
  });

  it('pins: a used refresh token presented again still revokes the grant (the contrast)', async () => {
    const { tokens } = await codeFlow(auth(), cli, alice, { scope: 'openid offline_access photos:read' });
    const first = await refresh(tokens.body.refresh_token, cli);
    expect(first.status).toBe(200);
    // Past the reuse interval (within it, the retry of a refresh whose answer was lost is answered).
    await usedLongAgo(tokens.body.refresh_token);
    expect((await refresh(tokens.body.refresh_token, cli)).body.error).toBe('invalid_grant');
    expect((await refresh(first.body.refresh_token, cli)).body.error).toBe('invalid_grant');
  });
});

describe('a refresh whose new refresh token the database failed to store', () => {
  // A provider on the same database whose next insert of a RefreshToken row fails once, as a
  // PostgreSQL restart or a dropped connection would make it fail.
  let failNextSave = false;
  let faulty: Awaited<ReturnType<typeof listen>>;

  beforeAll(async () => {
    const db = whole.db;
    const failingDb: Database = {
      ...db,
      async query<Row>(text: string, params?: readonly unknown[]) {
        // Any statement that stores a refresh token: a rotation's save is one statement with its use.
        if (failNextSave && /\binsert into idp_models\b/.test(text) && params?.[0] === 'RefreshToken') {
          failNextSave = false;
          throw new Error('connection terminated unexpectedly');
        }
        return db.query<Row>(text, params);
      },
    };
    faulty = await listen(0);
    const idp = await createIdp({ db: failingDb, issuer: faulty.url, resource: whole.stack.gateway.baseUrl });
    faulty.use(idp.app);
  });

  afterAll(async () => {
    await faulty?.close();
  });

  // Was wrong: oidc-provider consumes the presented refresh token, then stores its successor; when the
  // store fails the client gets a 5xx (503 now) and keeps the token it sent, which is now consumed. Its retry
  // (what a client does with a 5xx) was taken for reuse, and the whole grant revoked: one database
  // blip signed the user out. Now a used refresh token is answered once more within the reuse interval
  // (`refreshTokenReuseSeconds`, 30 seconds by default; `refresh-reuse.int.test.ts` has its bounds).
  it('lets the retry of the refused refresh, with the same token, through', async () => {
    const { tokens } = await codeFlow(auth(), app, alice);
    failNextSave = true;
    const failed = await tokenRequest(
      faulty.url,
      { grant_type: 'refresh_token', refresh_token: tokens.body.refresh_token },
      app,
    );
    expect(failNextSave).toBe(false);
    expect(failed.status).toBe(503);
    const retry = await refresh(tokens.body.refresh_token, app);
    expect(retry.status).toBe(200);
  });
});

describe('introspection (RFC 7662 section 2.1: the endpoint MUST require some form of authorization)', () => {
  const introspectAs = (token: string, headers: Record<string, string>, fields: Record<string, string> = {}) =>
    fetch(new URL('/token/introspection', auth()), {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
      body: new URLSearchParams({ token, ...fields }),
    }).then(async (response) => ({
      status: response.status,
      body: (await response.json()) as Record<string, unknown>,
    }));

  it('tells a caller that names the public client, and proves nothing, nothing about its tokens', async () => {
    const { tokens } = await codeFlow(auth(), cli, alice, { scope: 'openid offline_access photos:read' });
    // Was wrong: a client_id alone was enough (the public client has no secret), and anyone got back
    // `active`, the user's `sub`, the scopes and the expiry of whatever cli-pkce token they held or guessed.
    const answer = await introspectAs(tokens.body.refresh_token, {}, { client_id: cli.clientId });
    expect(answer.body).toEqual({ active: false });
    // The token itself is live: refused for who asked, not for what it is.
    expect((await refresh(tokens.body.refresh_token, cli)).status).toBe(200);
  });

  it('pins: the confidential app, authenticated, introspects its own refresh token (the contrast)', async () => {
    const { tokens } = await codeFlow(auth(), app, alice);
    const basic = Buffer.from(`${app.clientId}:${app.clientSecret}`).toString('base64');
    const answer = await introspectAs(tokens.body.refresh_token, { authorization: `Basic ${basic}` });
    expect(answer.body).toMatchObject({ active: true, client_id: app.clientId, sub: 'user-alice' });
  });
});

describe('DPoP-bound tokens (RFC 9449), which the provider issues to any client that sends a proof', () => {
  /** A client key and proofs made with it. */
  async function dpopKey() {
    const pair = await generateKeyPair('ES256');
    const jwk = await exportJWK(pair.publicKey);
    const proof = (htm: string, htu: string, accessToken?: string) =>
      new SignJWT({
        htm,
        htu,
        jti: randomUUID(),
        ...(accessToken ? { ath: createHash('sha256').update(accessToken).digest('base64url') } : {}),
      })
        .setProtectedHeader({ alg: 'ES256', typ: 'dpop+jwt', jwk })
        .setIssuedAt()
        .sign(pair.privateKey);
    return { proof, thumbprint: await calculateJwkThumbprint(jwk) };
  }

  /** The public client's code flow, its code redeemed with a DPoP proof: an API token bound to `key`. */
  async function boundTokens(key: Awaited<ReturnType<typeof dpopKey>>) {
    const { verifier, challenge } = pkcePair();
    const callback = await loginAndConsent(
      createUserAgent(),
      auth(),
      authorizationUrl(auth(), {
        clientId: cli.clientId,
        redirectUri: cli.redirectUri,
        challenge,
        challengeMethod: 'S256',
        scope: 'openid offline_access photos:read',
      }),
      cli.redirectUri,
      alice,
    );
    const tokenUrl = new URL('/token', auth()).href;
    const response = await fetch(tokenUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', dpop: await key.proof('POST', tokenUrl) },
      body: new URLSearchParams({
        grant_type: 'authorization_code',
        code: callback.searchParams.get('code') ?? '',
        code_verifier: verifier,
        redirect_uri: cli.redirectUri,
        client_id: cli.clientId,
      }),
    });
    expect(response.status).toBe(200);
    return (await response.json()) as { access_token: string; refresh_token: string; token_type: string };
  }

  it('pins: the provider binds the access and refresh tokens of a public client to its key', async () => {
    const key = await dpopKey();
    const tokens = await boundTokens(key);
    expect(tokens.token_type).toBe('DPoP');
    expect(decodeJwt(tokens.access_token).payload.cnf).toEqual({ jkt: key.thumbprint });
    // The refresh token needs a proof of the same key: stolen alone, it is worthless (RFC 9700 2.2.2).
    expect((await refresh(tokens.refresh_token, cli)).body.error).toBe('invalid_grant');
  });

  it('takes the bound token with its proof at the gateway, and refuses it as a bearer token', async () => {
    const key = await dpopKey();
    const tokens = await boundTokens(key);
    const url = new URL('/photos', gateway()).href;
    const asBearer = await fetch(url, { headers: { authorization: `Bearer ${tokens.access_token}` } });
    expect(asBearer.status).toBe(401);
    // Was wrong: the gateway took Bearer tokens only. The provider advertises DPoP and binds the tokens
    // of any client that uses it, so such a client got an API token that every API call refused (401).
    const withProof = await fetch(url, {
      headers: { authorization: `DPoP ${tokens.access_token}`, dpop: await key.proof('GET', url, tokens.access_token) },
    });
    expect(withProof.status).toBe(200);
  });

  it("names the same proof algorithms in the provider's discovery and the gateway's resource metadata", async () => {
    const json = async (url: URL) => (await (await fetch(url)).json()) as Record<string, unknown>;
    const provider = await json(new URL('/.well-known/openid-configuration', auth()));
    const resource = await json(new URL('/.well-known/oauth-protected-resource', gateway()));
    // Was wrong: the provider offered ES256, Ed25519 and EdDSA, the gateway took none (no DPoP at all).
    expect(resource.dpop_signing_alg_values_supported).toEqual(provider.dpop_signing_alg_values_supported);
  });

  it('refuses the bound token with a proof made for another URL, or by another key', async () => {
    const key = await dpopKey();
    const other = await dpopKey();
    const tokens = await boundTokens(key);
    const url = new URL('/photos', gateway()).href;
    const elsewhere = await fetch(url, {
      headers: {
        authorization: `DPoP ${tokens.access_token}`,
        dpop: await key.proof('GET', 'https://other-api.example/photos', tokens.access_token),
      },
    });
    expect(elsewhere.status).toBe(401);
    const stolen = await fetch(url, {
      headers: {
        authorization: `DPoP ${tokens.access_token}`,
        dpop: await other.proof('GET', url, tokens.access_token),
      },
    });
    expect(stolen.status).toBe(401);
  });
});

describe('each token only where it belongs (RFC 9700 section 2.3, audience restriction)', () => {
  it('refuses the API access token at UserInfo, and the ID, UserInfo and refresh tokens at the gateway', async () => {
    const { tokens } = await codeFlow(auth(), app, alice);
    const userinfo = await fetch(new URL('/me', auth()), {
      headers: { authorization: `Bearer ${tokens.body.access_token}` },
    });
    expect(userinfo.status).toBe(401);
    const opaque = (await codeFlow(auth(), cli, alice, { scope: 'openid' })).tokens.body.access_token as string;
    const photos = new URL('/photos', gateway());
    for (const token of [tokens.body.id_token, tokens.body.refresh_token, opaque]) {
      const response = await fetch(photos, { headers: { authorization: `Bearer ${token}` } });
      expect(response.status).toBe(401);
      expect(response.headers.get('www-authenticate')).toContain('error="invalid_token"');
    }
    // The contrast: the API token itself.
    const ok = await fetch(photos, { headers: { authorization: `Bearer ${tokens.body.access_token}` } });
    expect(ok.status).toBe(200);
  });
});

describe('OpenID Connect Core: max_age, auth_time, prompt=none, sub', () => {
  /** alice's browser, signed in at the provider with a grant for the app. */
  async function signedInAgent() {
    const { agent } = await codeFlow(auth(), app, alice);
    return agent;
  }

  const start = (extra: Record<string, string>, scope?: string) => {
    const { verifier, challenge } = pkcePair();
    const url = new URL(
      authorizationUrl(auth(), {
        clientId: app.clientId,
        redirectUri: app.redirectUri,
        challenge,
        challengeMethod: 'S256',
        prompt: extra.prompt ?? 'consent',
        ...(scope ? { scope } : {}),
      }),
    );
    for (const [name, value] of Object.entries(extra)) if (name !== 'prompt') url.searchParams.set(name, value);
    if (extra.prompt === '') url.searchParams.delete('prompt');
    return { url: url.href, verifier };
  };
  const toApp = (url: string) => url.startsWith(app.redirectUri);

  it('answers prompt=none without a session with login_required, to the client, with iss', async () => {
    const step = await createUserAgent().follow(start({ prompt: 'none' }).url, toApp);
    const callback = new URL(step.url);
    expect(callback.searchParams.get('error')).toBe('login_required');
    expect(callback.searchParams.get('iss')).toBe(auth());
    expect(callback.searchParams.get('code')).toBeNull();
  });

  it('session fixation: cookies an attacker planted before the sign-in do not become the signed-in session', async () => {
    // The attacker opens a sign-in of their own and plants every cookie the provider gave them in
    // the victim's browser (a sibling subdomain can toss cookies); the victim then signs in.
    const attacker = createUserAgent();
    const page = await attacker.follow(start({}).url, toApp);
    expect(page.body).toContain('<h1>Sign in</h1>');
    const planted = new Map(attacker.jar.cookies);
    // Interaction cookies only: the provider makes no session before a sign-in, so there is none to fix.
    expect([...planted.keys()].sort()).toEqual([
      '_interaction',
      '_interaction.sig',
      '_interaction_resume',
      '_interaction_resume.sig',
      'idp_csrf',
    ]);
    const victim = createUserAgent();
    for (const [name, cookie] of planted) victim.jar.cookies.set(name, cookie);
    await codeFlow(auth(), app, alice, {}, victim);
    expect(victim.jar.cookies.get('_session')?.value).toEqual(expect.any(String));
    // With the cookies it planted, the attacker is not signed in as the victim: its own sign-in still
    // asks for a password, and a silent one finds no session.
    expect((await attacker.request(page.url)).body).toContain('<h1>Sign in</h1>');
    const silent = await attacker.follow(start({ prompt: 'none' }).url, toApp);
    expect(new URL(silent.url).searchParams.get('error')).toBe('login_required');
    expect(new URL(silent.url).searchParams.get('code')).toBeNull();
  });

  it('answers prompt=none for a scope not yet granted with consent_required', async () => {
    const agent = await signedInAgent();
    const step = await agent.follow(start({ prompt: 'none' }, 'openid settings:write').url, toApp);
    expect(new URL(step.url).searchParams.get('error')).toBe('consent_required');
  });

  it('puts auth_time into the ID token when max_age is asked for, and makes max_age=0 sign in again', async () => {
    const agent = await signedInAgent();
    const before = Math.floor(Date.now() / 1000);
    const silent = start({ prompt: 'none', max_age: '3600' }, 'openid');
    const step = await agent.follow(silent.url, toApp);
    const code = new URL(step.url).searchParams.get('code');
    expect(code).toEqual(expect.any(String));
    const tokens = await tokenRequest(
      auth(),
      {
        grant_type: 'authorization_code',
        code: code ?? '',
        redirect_uri: app.redirectUri,
        code_verifier: silent.verifier,
      },
      app,
    );
    const authTime = decodeJwt(tokens.body.id_token).payload.auth_time as number;
    expect(authTime).toBeLessThanOrEqual(before + 1);

    // max_age=0 with prompt=none cannot be met without a login.
    const none = await agent.follow(start({ prompt: 'none', max_age: '0' }).url, toApp);
    expect(new URL(none.url).searchParams.get('error')).toBe('login_required');
    // Without prompt=none, the login page, although alice is signed in.
    const again = start({ prompt: '', max_age: '0' }, 'openid');
    const page = await agent.follow(again.url, toApp);
    expect(page.body).toContain('<h1>Sign in</h1>');
    const login = await agent.postForm(new URL(formAction(page.body, 'login'), auth()).href, {
      csrf: formField(page.body, 'csrf'),
      ...alice,
    });
    const back = await agent.follow(new URL(login.response.headers.get('location') ?? '', auth()).href, toApp);
    const fresh = await tokenRequest(
      auth(),
      {
        grant_type: 'authorization_code',
        code: new URL(back.url).searchParams.get('code') ?? '',
        redirect_uri: app.redirectUri,
        code_verifier: again.verifier,
      },
      app,
    );
    expect(decodeJwt(fresh.body.id_token).payload.auth_time).toBeGreaterThanOrEqual(before);
  });

  it('gives one user the same sub at every client and every sign-in', async () => {
    const first = await codeFlow(auth(), app, alice);
    const second = await codeFlow(auth(), app, alice);
    const native = await codeFlow(auth(), cli, alice, { scope: 'openid' });
    const subs = [first, second, native].map(({ tokens }) => decodeJwt(tokens.body.id_token).payload.sub);
    expect(new Set(subs)).toEqual(new Set(['user-alice']));
  });
});

describe('pushed authorization requests (RFC 9126) follow the same rules as the front channel', () => {
  const push = async (fields: Record<string, string>, client: Credentials) => {
    const headers: Record<string, string> = { 'content-type': 'application/x-www-form-urlencoded' };
    if (client.clientSecret !== undefined) {
      headers.authorization = `Basic ${Buffer.from(`${client.clientId}:${client.clientSecret}`).toString('base64')}`;
    }
    const response = await fetch(new URL('/request', auth()), {
      method: 'POST',
      headers,
      body: new URLSearchParams({
        client_id: client.clientId,
        response_type: 'code',
        scope: 'openid photos:read',
        state: 'state-1',
        nonce: 'nonce-1',
        ...fields,
      }),
    });
    return { status: response.status, body: (await response.json()) as Record<string, string> };
  };

  const s256 = () => ({ code_challenge: pkcePair().challenge, code_challenge_method: 'S256' });

  it.each([
    ['code_challenge_method=plain', () => ({ code_challenge: pkcePair().verifier, code_challenge_method: 'plain' })],
    ['no code_challenge', () => ({})],
    ['an unregistered redirect_uri', () => ({ ...s256(), redirect_uri: 'https://evil.example/callback' })],
    ['response_type=token', () => ({ ...s256(), response_type: 'token' })],
  ])('refuses %s', async (_name, fields) => {
    const answer = await push({ redirect_uri: app.redirectUri, ...fields() }, app);
    expect(answer.status).toBe(400);
    expect(answer.body.request_uri).toBeUndefined();
  });

  it("refuses a request_uri pushed by the app when another client's id comes with it", async () => {
    const pushed = await push({ redirect_uri: app.redirectUri, ...s256() }, app);
    expect(pushed.status).toBe(201);
    const url = new URL('/auth', auth());
    url.searchParams.set('client_id', cli.clientId);
    url.searchParams.set('request_uri', pushed.body.request_uri ?? '');
    const response = await fetch(url, { redirect: 'manual' });
    expect(response.status).toBe(400);
    expect(response.headers.get('location')).toBeNull();
  });
});
