// Session and browser-level checks of the sign-in flows (audit): the cookies a browser keeps for the
// identity provider and the app, a sign-in in progress while the app is open in another tab, and the
// ID token a refresh brings back. Each `it.fails` is a defect found; real HTTP against real servers.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createThirdPartyApp, type ThirdPartyAppEvent } from '../src/app/server.js';
import { createIdp } from '../src/idp/server.js';
import { storedId } from '../src/idp/stored-id.js';
import { type ListeningPort, listen } from '../src/listen.js';
import { authorizationUrl, loginAndConsent } from './flow.js';
import { alice, bob } from './test-idp.js';
import { startWholeStack, type WholeStack } from './test-stack.js';
import { createUserAgent, formAction, formField, pkcePair } from './user-agent.js';

let whole: WholeStack;

beforeAll(async () => {
  whole = await startWholeStack('session_security');
}, 120_000);

afterAll(async () => {
  await whole?.close();
});

const cookieName = (raw: string) => raw.slice(0, raw.indexOf('='));
const live = (raw: string) => !/max-age=0|expires=thu, 01 jan 1970/i.test(raw);

describe('the identity provider on an https issuer', () => {
  // The app names its cookies `__Host-` over https (server.ts cookieNames) so that a sibling subdomain
  // cannot plant one ahead of its own (cookie tossing). The provider's sign-in session is the more
  // valuable cookie: a `_session`/`_session.sig` pair the attacker got by signing in as themselves,
  // tossed from evil.example.com with `Domain=example.com; Path=/auth`, is sent first to the provider's
  // /auth, and the victim pressing "Sign in" in the app lands on "Signed in as <attacker>" (login CSRF).
  // Its path is `/`, it is Secure and has no Domain: nothing stops the prefix (`cookies.names.session`).
  const issuer = 'https://idp.session-security.test';
  let port: ListeningPort;
  let cookies: string[] = [];

  beforeAll(async () => {
    port = await listen(0);
    const idp = await createIdp({ db: whole.db, issuer, resource: whole.stack.gateway.baseUrl });
    port.use(idp.app);
    const local = (url: string) => {
      const parsed = new URL(url, issuer);
      return new URL(parsed.pathname + parsed.search, port.url).href;
    };
    const agent = createUserAgent();
    const keep = (step: { response: Response }) => cookies.push(...step.response.headers.getSetCookie());
    const start = await agent.request(
      local(
        authorizationUrl(issuer, {
          clientId: whole.running.clients.app.clientId,
          redirectUri: whole.running.clients.app.redirectUri,
          challenge: pkcePair().challenge,
          challengeMethod: 'S256',
        }),
      ),
    );
    keep(start);
    const page = await agent.request(local(start.response.headers.get('location') ?? ''));
    keep(page);
    const login = await agent.postForm(local(formAction(page.body, 'login')), {
      csrf: formField(page.body, 'csrf'),
      ...alice,
    });
    expect(login.response.status).toBe(303);
    keep(await agent.request(local(login.response.headers.get('location') ?? '')));
    cookies = cookies.filter(live);
  });

  afterAll(async () => {
    await port?.close();
  });

  it('pins: the sign-in session cookies go out Secure, HttpOnly, SameSite=Lax, Path=/ and with no Domain', () => {
    const session = cookies.filter((raw) => /;\s*path=\/(;|$)/i.test(raw));
    expect(session.length).toBeGreaterThan(0);
    for (const raw of session) {
      expect(raw).toMatch(/;\s*secure/i);
      expect(raw).toMatch(/;\s*httponly/i);
      expect(raw).toMatch(/;\s*samesite=lax/i);
      expect(raw).not.toMatch(/domain=/i);
    }
  });

  // Was a defect: the provider keeps its 14-day sign-in session in `_session` (and `_session.sig`) even over https, where the `__Host-` prefix is possible and would refuse a cookie tossed from a sibling subdomain.
  it('names its sign-in session cookies __Host- over https, as the app does', () => {
    const session = cookies.filter((raw) => /;\s*path=\/(;|$)/i.test(raw)).map(cookieName);
    expect(session.length).toBeGreaterThan(0);
    expect(session.filter((name) => !name.startsWith('__Host-'))).toEqual([]);
  });
});

describe('the app served over https, its URL written with an upper-case scheme', () => {
  // URL schemes are case-insensitive (RFC 3986 3.1) and `APP_URL=HTTPS://app.example` passes envUrl;
  // the app decides on Secure and `__Host-` with `appUrl.startsWith('https:')` on the raw string.
  // Its redirect URI (`new URL('/callback', appUrl)`) is https all the same, so sign-in works and
  // nothing tells the operator that the session cookie goes out without Secure.
  // Was a defect: server.ts compares the raw appUrl with 'https:', so an https app whose URL is spelled HTTPS:// sets a plain app_session cookie without Secure or the __Host- prefix.
  it('marks the session cookie Secure and names it __Host- whatever the case of the scheme', async () => {
    const port = await listen(0);
    try {
      const { app } = await createThirdPartyApp({
        db: whole.db,
        issuer: whole.running.authUrl,
        clientId: whole.running.clients.app.clientId,
        clientSecret: whole.running.clients.app.clientSecret,
        appUrl: 'HTTPS://app.session-security.test',
        baseUrl: whole.stack.gateway.baseUrl,
      });
      port.use(app);
      const step = await fetch(new URL('/signin', port.url), { redirect: 'manual' });
      expect(step.status).toBe(303);
      // The redirect URI the provider gets is https: the app knows it is served over https.
      expect(new URL(step.headers.get('location') ?? '').searchParams.get('redirect_uri')).toBe(
        'https://app.session-security.test/callback',
      );
      const session = step.headers.getSetCookie().find((raw) => raw.includes('app_session='));
      expect(session && cookieName(session)).toBe('__Host-app_session');
      expect(session).toMatch(/;\s*Secure/i);
    } finally {
      await port.close();
    }
  });
});

describe('a sign-in in progress while the app is open in another tab', () => {
  // The person presses "Sign in" (a pending session: state, nonce and PKCE verifier, bound to this
  // browser by its cookie), and while the provider's login page is open, the app's root is loaded in
  // another tab (or Back is pressed to it: every page is no-store, so it is fetched again). GET / sees
  // a cookie that is not a signed-in session and clears it; the callback then finds no transaction.
  // Was a defect: GET / clears the session cookie whenever the browser is not signed in, a sign-in in progress included, so that sign-in's callback fails with "unknown or already used".
  it('still completes the sign-in after the app root was loaded meanwhile', async () => {
    const { authUrl, appUrl } = whole.running;
    const agent = createUserAgent();
    const callback = await loginAndConsent(
      agent,
      authUrl,
      new URL('/signin', appUrl).href,
      whole.running.clients.app.redirectUri,
      alice,
    );
    const otherTab = await agent.request(new URL('/', appUrl).href);
    expect(otherTab.response.status).toBe(200);
    const landed = await agent.request(callback.href);
    expect(landed.body).not.toContain('unknown or was already used');
    expect(landed.response.status).toBe(303);
    const home = await agent.request(new URL('/', appUrl).href);
    expect(home.body).toContain('Alice Liddell');
  });

  it("pins: login CSRF at the callback: bob's own callback, opened in alice's browser mid sign-in, is refused and leaves hers", async () => {
    const { authUrl, appUrl } = whole.running;
    const redirectUri = whole.running.clients.app.redirectUri;
    // The attacker (bob) signs in in his own browser and stops at the callback, code unused.
    const attacker = createUserAgent();
    const forged = await loginAndConsent(attacker, authUrl, new URL('/signin', appUrl).href, redirectUri, bob);
    // alice pressed "Sign in" and is at the provider when bob's callback is opened in her browser.
    const victim = createUserAgent();
    const hers = await loginAndConsent(victim, authUrl, new URL('/signin', appUrl).href, redirectUri, alice);
    const planted = await victim.request(forged.href);
    expect(planted.response.status).toBe(400);
    // Her own sign-in is untouched, and she is alice, not bob.
    expect((await victim.request(hers.href)).response.status).toBe(303);
    const home = await victim.request(new URL('/', appUrl).href);
    expect(home.body).toContain('Alice Liddell');
    expect(home.body).not.toContain('Bob Builder');
  });
});

describe('a refresh whose ID token names another user', () => {
  // OIDC Core 12.2: an ID token from a refresh "MUST" have the same `iss` and `sub` as the one of the
  // original authentication. oauth4webapi checks iss, aud, exp and the signature, but cannot know the
  // first `sub`; the app (refreshClaimed, refresh.ts) then replaces the session's user with whatever the new ID
  // token names. A scripted provider, signing with its own published key, stands in for a provider that
  // gets this wrong (a mix-up of accounts, a bug in a pairwise subject): the app must refuse it.
  let provider: Server;
  let issuer: string;
  let appPort: ListeningPort;
  let clock = Date.now();
  let nonce = '';
  /** What the app reported: the scripted provider has no revocation endpoint to answer (404). */
  const events: ThirdPartyAppEvent[] = [];

  beforeAll(async () => {
    const { privateKey, publicKey } = await generateKeyPair('RS256');
    const jwk = { ...(await exportJWK(publicKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
    const idToken = (sub: string, name: string, withNonce: boolean) => {
      const now = Math.floor(Date.now() / 1000);
      // `auth_time`: the app asks for `max_age`, and OIDC Core 3.1.2.1 then requires it.
      return new SignJWT({ sub, name, auth_time: now - 60, ...(withNonce ? { nonce } : {}) })
        .setProtectedHeader({ alg: 'RS256', kid: 'k1' })
        .setIssuer(issuer)
        .setAudience(whole.running.clients.app.clientId)
        .setIssuedAt(now)
        .setExpirationTime(now + 300)
        .sign(privateKey);
    };
    provider = createServer(async (req, res) => {
      const json = (value: unknown) =>
        res
          .writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' })
          .end(JSON.stringify(value));
      if (req.url === '/.well-known/openid-configuration') {
        return json({
          issuer,
          authorization_endpoint: `${issuer}/auth`,
          token_endpoint: `${issuer}/token`,
          jwks_uri: `${issuer}/jwks`,
          revocation_endpoint: `${issuer}/revoke`,
          authorization_response_iss_parameter_supported: true,
          id_token_signing_alg_values_supported: ['RS256'],
        });
      }
      if (req.url === '/jwks') return json({ keys: [jwk] });
      if (req.url === '/token') {
        let body = '';
        for await (const chunk of req) body += chunk;
        const grant = new URLSearchParams(body).get('grant_type');
        const token = (sub: string, name: string, first: boolean) =>
          idToken(sub, name, first).then((id_token) =>
            json({
              access_token: `at-${sub}-${grant}`,
              token_type: 'Bearer',
              expires_in: 300,
              refresh_token: `rt-${sub}-${Math.random()}`,
              id_token,
            }),
          );
        if (grant === 'authorization_code') return token('user-alice', 'Alice Liddell', true);
        if (grant === 'refresh_token') return token('user-mallory', 'Mallory Intruder', false);
      }
      res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => provider.listen(0, '127.0.0.1', resolve));
    issuer = `http://localhost:${(provider.address() as AddressInfo).port}`;
    appPort = await listen(0);
    const { app } = await createThirdPartyApp({
      db: whole.db,
      issuer,
      clientId: whole.running.clients.app.clientId,
      clientSecret: whole.running.clients.app.clientSecret,
      appUrl: appPort.url,
      baseUrl: whole.stack.gateway.baseUrl,
      now: () => clock,
      onEvent: (event) => events.push(event),
    });
    appPort.use(app);
  });

  afterAll(async () => {
    await appPort?.close();
    await new Promise<void>((resolve) => (provider ? provider.close(() => resolve()) : resolve()));
  });

  /** Signs alice in against the scripted provider: the app's own redirect, then its callback. */
  async function signIn() {
    const agent = createUserAgent();
    const start = await agent.request(new URL('/signin', appPort.url).href);
    const auth = new URL(start.response.headers.get('location') ?? '');
    nonce = auth.searchParams.get('nonce') ?? '';
    const callback = new URL('/callback', appPort.url);
    callback.searchParams.set('code', 'code-1');
    callback.searchParams.set('state', auth.searchParams.get('state') ?? '');
    callback.searchParams.set('iss', issuer);
    const landed = await agent.request(callback.href);
    expect(landed.response.status).toBe(303);
    return agent;
  }

  it('pins: the ID token of the sign-in is taken, and the page shows alice (the contrast)', async () => {
    const agent = await signIn();
    const home = await agent.request(new URL('/', appPort.url).href);
    expect(home.body).toContain('Alice Liddell');
  });

  // Was a defect: refreshClaimed (refresh.ts; then refreshSession in server.ts) stored `result.user` from a refreshed ID token without comparing its sub with the session's, so the signed-in session silently becomes another account.
  it("never turns alice's session into another user's on a refresh (OIDC Core 12.2)", async () => {
    const agent = await signIn();
    clock += 10 * 60_000;
    const home = await agent.request(new URL('/', appPort.url).href);
    expect(home.body).not.toContain('Mallory Intruder');
    expect(home.body).not.toContain('user-mallory');
  });

  // Was wrong: the revocation of the tokens such a refresh brought back, when it failed, was reported
  // as `during: 'sign-out'`, though nobody signed out: the operator reading it looked in the wrong place.
  it("reports a failed revocation of that refresh's tokens as during a refresh, not a sign-out", async () => {
    const agent = await signIn();
    events.length = 0;
    clock += 10 * 60_000;
    await agent.request(new URL('/', appPort.url).href);
    const failed = events.filter((event) => event.type === 'revocation-failed');
    expect(failed.map((event) => event.type === 'revocation-failed' && [event.during, event.tokenType])).toEqual(
      expect.arrayContaining([
        ['refresh', 'refresh_token'],
        ['refresh', 'access_token'],
      ]),
    );
    expect(failed).toHaveLength(2);
  });
});

describe("the identity provider's own sign-in session", () => {
  // Was wrong: oidc-provider saves its session with the whole `ttl.Session` (14 days) on each visit
  // that reads it (any app's "Sign in"), so a browser that came back within 14 days each time stayed
  // signed in at the provider for ever and was never asked for the password again (OWASP ASVS 3.3.2).
  // Now it ends 14 days after the password was given, however often it is used (12 hours by default
  // since: `sign-in-lifetime.audit.int.test.ts`). The sign-in time is the session's `loginTs`, stored
  // server-side; the test ages it in the row (the clocks run on).
  const app = () => whole.running.clients.app;
  const start = () =>
    authorizationUrl(whole.running.authUrl, {
      clientId: app().clientId,
      redirectUri: app().redirectUri,
      challenge: pkcePair().challenge,
      challengeMethod: 'S256',
    });
  const signedIn = async () => {
    const agent = createUserAgent();
    await loginAndConsent(agent, whole.running.authUrl, start(), app().redirectUri, alice);
    const id = agent.jar.cookies.get('_session')?.value;
    expect(id).toEqual(expect.any(String));
    return { agent, id: id! };
  };
  const signedInDaysAgo = (id: string, days: number) =>
    whole.db.query(
      `update idp_models set payload = jsonb_set(payload, '{loginTs}', to_jsonb(extract(epoch from now())::bigint - $2::bigint))
        where model = 'Session' and id = $1 and payload ? 'loginTs'`,
      [storedId('Session', id), Math.round(days * 86_400)],
    );
  const daysLeft = async (id: string) =>
    (
      await whole.db.query<{ left: number }>(
        `select extract(epoch from expires_at - now())::float8 / 86400 as left from idp_models where model = 'Session' and id = $1`,
        [storedId('Session', id)],
      )
    ).rows[0]?.left;

  // Each visit saves it for 30 minutes (its idle limit, `sign-in-lifetime.audit.int.test.ts`), or
  // for what is left of the 12 hours when that is less.
  it('does not extend the session past 12 hours from the sign-in when it is used', async () => {
    const { agent, id } = await signedIn();
    const aged = await signedInDaysAgo(id, (11 * 60 + 50) / 1440);
    expect(aged.rowCount).toBe(1);
    // Another "Sign in": the provider reads the session, and saves it again.
    const visit = await agent.request(start());
    expect(visit.response.status).toBe(303);
    expect(await daysLeft(id)).toBeLessThanOrEqual(10.02 / 1440);
  });

  it('asks for the password again once 12 hours have passed since it was given, whatever the row says', async () => {
    const { agent, id } = await signedIn();
    // A session a visit extended before the limit existed: its row still has hours to go.
    await whole.db.query(
      `update idp_models set expires_at = now() + interval '11 hours' where model = 'Session' and id = $1`,
      [storedId('Session', id)],
    );
    await signedInDaysAgo(id, 12.01 / 24);
    expect(await daysLeft(id)).toBeGreaterThan(10 / 24);
    const page = await agent.follow(start(), (url) => url.startsWith(app().redirectUri));
    expect(page.body).toContain('<h1>Sign in</h1>');
  });
});
