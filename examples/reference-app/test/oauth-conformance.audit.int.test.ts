// Conformance re-audit of the provider (research/oauth-oidc-anchors.md, section 4): the checks no
// other file pinned. Redirect URIs of the native client (RFC 8252 section 7.3 exempts the loopback
// port, nothing else), the RP-initiated logout's post_logout_redirect_uri (no open redirector,
// RFC 9700 section 4.11), and a refresh token of the confidential app presented without its secret.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningReferenceApp } from '../src/start.js';
import { authorizationUrl, type Credentials, codeFlow, tokenRequest } from './flow.js';
import { alice, startTestIdp, type TestIdp } from './test-idp.js';
import { createUserAgent, pkcePair } from './user-agent.js';

let started: TestIdp;
let running: RunningReferenceApp;
let app: Required<Credentials>;
let cli: Credentials;

beforeAll(async () => {
  started = await startTestIdp('oauth_conformance');
  ({ running, app, cli } = started);
});

afterAll(() => started?.close());

const auth = () => running.authUrl;

async function authorizeOnly(clientId: string, redirectUri: string) {
  const { challenge } = pkcePair();
  return fetch(authorizationUrl(auth(), { clientId, redirectUri, challenge, challengeMethod: 'S256' }), {
    redirect: 'manual',
  });
}

describe('the native client: any loopback port, and nothing else different (RFC 8252 section 7.3, row 1)', () => {
  it('pins: takes its registered loopback URI on any port (the contrast)', async () => {
    for (const port of ['4321', '65000']) {
      const response = await authorizeOnly(cli.clientId, `http://127.0.0.1:${port}/callback`);
      expect(response.status).toBe(303);
      expect(response.headers.get('location')).toMatch(/^\/interaction\//);
    }
  });

  it.each([
    ['another loopback name (localhost)', 'http://localhost:4321/callback'],
    ['another loopback address (::1)', 'http://[::1]:4321/callback'],
    ['an extra path', 'http://127.0.0.1:4321/callback/x'],
    ['a trailing slash', 'http://127.0.0.1:4321/callback/'],
    ['another case', 'http://127.0.0.1:4321/Callback'],
    ['a query', 'http://127.0.0.1:4321/callback?next=https://evil.example'],
    ['https', 'https://127.0.0.1:4321/callback'],
    ['user information', 'http://evil@127.0.0.1:4321/callback'],
    ['a host behind user information', 'http://127.0.0.1:4321@evil.example/callback'],
    ['another host on the port', 'http://evil.example:4321/callback'],
  ])('refuses %s with a page, not a redirect', async (_name, redirectUri) => {
    const response = await authorizeOnly(cli.clientId, redirectUri);
    expect(response.status).toBe(400);
    expect(response.headers.get('location')).toBeNull();
    expect(await response.text()).toContain('redirect_uri');
  });

  it.each([
    ['a query', (uri: string) => `${uri}?next=https://evil.example`],
    ['user information', (uri: string) => uri.replace('http://', 'http://evil@')],
    ['a fragment', (uri: string) => `${uri}#x`],
  ])("refuses the web app's redirect URI with %s, without redirecting to it", async (_name, mutate) => {
    const response = await authorizeOnly(app.clientId, mutate(app.redirectUri));
    expect(response.status).toBe(400);
    expect(response.headers.get('location')).toBeNull();
  });
});

describe('no open redirector at the authorization endpoint (RFC 9700 section 4.11.1)', () => {
  const evil = 'https://evil.example/callback';
  const base = () => {
    const url = new URL('/auth', auth());
    url.searchParams.set('client_id', app.clientId);
    url.searchParams.set('redirect_uri', evil);
    url.searchParams.set('response_type', 'code');
    url.searchParams.set('scope', 'openid');
    url.searchParams.set('state', 's');
    url.searchParams.set('code_challenge', pkcePair().challenge);
    url.searchParams.set('code_challenge_method', 'S256');
    return url;
  };
  it.each<[string, (url: URL) => void]>([
    ['response_type=token', (url) => url.searchParams.set('response_type', 'token')],
    ['no response_type', (url) => url.searchParams.delete('response_type')],
    ['an unknown scope', (url) => url.searchParams.set('scope', 'openid nope')],
    ['code_challenge_method=plain', (url) => url.searchParams.set('code_challenge_method', 'plain')],
    ['no PKCE', (url) => url.searchParams.delete('code_challenge')],
    ['response_mode=form_post', (url) => url.searchParams.set('response_mode', 'form_post')],
    ['an unknown response_mode', (url) => url.searchParams.set('response_mode', 'web_message')],
    ['a request object', (url) => url.searchParams.set('request', 'eyJhbGciOiJub25lIn0.e30.')],
    ['a request_uri', (url) => url.searchParams.set('request_uri', 'urn:ietf:params:oauth:request_uri:x')],
    ['prompt=none', (url) => url.searchParams.set('prompt', 'none')],
    ['the registered redirect_uri next to it', (url) => url.searchParams.append('redirect_uri', app.redirectUri)],
    [
      'the registered redirect_uri before it',
      (url) => {
        url.searchParams.delete('redirect_uri');
        url.searchParams.append('redirect_uri', app.redirectUri);
        url.searchParams.append('redirect_uri', evil);
      },
    ],
  ])(
    'sends the browser nowhere off the provider for a request with an unregistered redirect_uri and %s',
    async (_name, change) => {
      const url = base();
      change(url);
      const response = await fetch(url, { redirect: 'manual' });
      const location = response.headers.get('location');
      if (location !== null) expect(new URL(location, auth()).origin).toBe(new URL(auth()).origin);
      expect(await response.text()).not.toContain('evil.example');
    },
  );
});

describe('RP-initiated logout: post_logout_redirect_uri is no open redirector', () => {
  const appHome = () => new URL('/', app.redirectUri).href;

  it.each([
    ['another site', () => ({ client_id: app.clientId, post_logout_redirect_uri: 'https://evil.example/' })],
    ['an extra path', () => ({ client_id: app.clientId, post_logout_redirect_uri: `${appHome()}x` })],
    ['a query', () => ({ client_id: app.clientId, post_logout_redirect_uri: `${appHome()}?to=https://evil.example` })],
    [
      "the app's redirect URI, not its post-logout one",
      () => ({ client_id: app.clientId, post_logout_redirect_uri: app.redirectUri }),
    ],
    ['another client named with it', () => ({ client_id: cli.clientId, post_logout_redirect_uri: appHome() })],
  ])('refuses one of %s for a signed-in user, and sends the browser nowhere', async (_name, fields) => {
    const { agent } = await codeFlow(auth(), app, alice);
    const url = new URL('/session/end', auth());
    for (const [name, value] of Object.entries(fields())) url.searchParams.set(name, value);
    url.searchParams.set('state', 'state-7');
    const step = await agent.request(url.href);
    expect(step.response.status).toBe(400);
    expect(step.response.headers.get('location')).toBeNull();
    expect(step.body).not.toContain('evil.example');
    // No form that would carry the browser on to it either.
    expect(step.body).not.toContain('op.logoutForm');
  });

  it("drops one that comes without a client: the confirmed logout ends on the provider's own page", async () => {
    const { agent } = await codeFlow(auth(), app, alice);
    const url = new URL('/session/end', auth());
    url.searchParams.set('post_logout_redirect_uri', 'https://evil.example/');
    const confirm = await agent.request(url.href);
    expect(confirm.response.status).toBe(200);
    expect(confirm.body).not.toContain('evil.example');
    const action = /<form id="op.logoutForm" method="post" action="([^"]+)"/.exec(confirm.body)?.[1];
    const xsrf = /name="xsrf" value="([^"]+)"/.exec(confirm.body)?.[1];
    const done = await agent.postForm(new URL(action ?? '', auth()).href, { xsrf: xsrf ?? '', logout: 'yes' });
    expect(done.response.status).toBe(303);
    const location = new URL(done.response.headers.get('location') ?? '', auth());
    expect(location.origin).toBe(new URL(auth()).origin);
    expect((await agent.request(location.href)).body).toContain('<h1>Signed out</h1>');
  });

  it('pins: goes back to the registered one, with the state, once the user confirms (the contrast)', async () => {
    const { agent } = await codeFlow(auth(), app, alice);
    const url = new URL('/session/end', auth());
    url.searchParams.set('client_id', app.clientId);
    url.searchParams.set('post_logout_redirect_uri', appHome());
    url.searchParams.set('state', 'state-7');
    const confirm = await agent.request(url.href);
    expect(confirm.response.status).toBe(200);
    const action = /<form id="op.logoutForm" method="post" action="([^"]+)"/.exec(confirm.body)?.[1];
    const xsrf = /name="xsrf" value="([^"]+)"/.exec(confirm.body)?.[1];
    const done = await agent.postForm(new URL(action ?? '', auth()).href, { xsrf: xsrf ?? '', logout: 'yes' });
    expect(done.response.status).toBe(303);
    expect(done.response.headers.get('location')).toBe(`${appHome()}?state=state-7`);
  });
});

describe('token endpoint client authentication on a refresh (row 15)', () => {
  it("refuses the app's refresh token presented without its secret, or as the public client, and leaves it usable", async () => {
    const flow = await codeFlow(auth(), app, alice);
    const refreshToken = flow.tokens.body.refresh_token as string;
    expect(refreshToken).toEqual(expect.any(String));
    const noSecret = await tokenRequest(
      auth(),
      { grant_type: 'refresh_token', refresh_token: refreshToken },
      { clientId: app.clientId },
    );
    expect(noSecret.status).toBe(401);
    expect(noSecret.body.error).toBe('invalid_client');
    const asPublic = await tokenRequest(
      auth(),
      { grant_type: 'refresh_token', refresh_token: refreshToken },
      { clientId: cli.clientId },
    );
    expect(asPublic.body.error).toBe('invalid_grant');
    // Neither spent it: the app itself still refreshes with it.
    const own = await tokenRequest(auth(), { grant_type: 'refresh_token', refresh_token: refreshToken }, app);
    expect(own.status).toBe(200);
    expect(own.body.refresh_token).not.toBe(refreshToken);
  });
  it.each([
    ['the right secret twice', (secret: string) => secret],
    ['a wrong one in the header, the right one in the body', () => 'wrong'],
  ])(
    'refuses a request that authenticates two ways at once, %s (RFC 6749 section 2.3)',
    async (_name, headerSecret) => {
      const flow = await codeFlow(auth(), app, alice);
      const refreshToken = flow.tokens.body.refresh_token as string;
      const basic = Buffer.from(`${app.clientId}:${headerSecret(app.clientSecret)}`).toString('base64');
      const response = await fetch(new URL('/token', auth()), {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Basic ${basic}` },
        body: new URLSearchParams({
          grant_type: 'refresh_token',
          refresh_token: refreshToken,
          client_id: app.clientId,
          client_secret: app.clientSecret,
        }),
      });
      expect(response.status).toBeGreaterThanOrEqual(400);
      expect(response.status).toBeLessThan(500);
      expect(((await response.json()) as { error: string }).error).toMatch(/^invalid_(request|client)$/);
      // Refused before the grant was looked at: the token still refreshes.
      const own = await tokenRequest(auth(), { grant_type: 'refresh_token', refresh_token: refreshToken }, app);
      expect(own.status).toBe(200);
    },
  );
});

describe('the authorization endpoint never answers in a frame or to a script of another site', () => {
  it('answers a CORS preflight of the authorization endpoint without allowing the origin (row 30)', async () => {
    const response = await fetch(new URL('/auth', auth()), {
      method: 'OPTIONS',
      headers: {
        origin: 'https://evil.example',
        'access-control-request-method': 'GET',
        'access-control-request-headers': 'authorization',
      },
    });
    expect(response.status).toBeLessThan(500);
    expect(response.headers.get('access-control-allow-origin')).toBeNull();
    expect(response.headers.get('access-control-allow-credentials')).toBeNull();
  });

  it('sends the login page a browser lands on with frame-ancestors none and X-Frame-Options DENY (row 29)', async () => {
    const agent = createUserAgent();
    const { challenge } = pkcePair();
    const step = await agent.follow(
      authorizationUrl(auth(), {
        clientId: app.clientId,
        redirectUri: app.redirectUri,
        challenge,
        challengeMethod: 'S256',
      }),
    );
    expect(step.body).toContain('<h1>Sign in</h1>');
    expect(step.response.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    expect(step.response.headers.get('x-frame-options')).toBe('DENY');
  });
});

describe("the third-party app's authorization requests", () => {
  it('makes state, nonce and the PKCE challenge fresh for every sign-in, in one browser or two (RFC 9700 section 2.1.1)', async () => {
    const one = createUserAgent();
    const two = createUserAgent();
    const starts = [];
    for (const agent of [one, one, two]) {
      const step = await agent.request(new URL('/signin', running.appUrl).href);
      expect(step.response.status).toBe(303);
      starts.push(new URL(step.response.headers.get('location') ?? '').searchParams);
    }
    for (const name of ['state', 'nonce', 'code_challenge']) {
      const values = starts.map((params) => params.get(name));
      expect(values.every((value) => typeof value === 'string' && value.length >= 43)).toBe(true);
      expect(new Set(values).size).toBe(starts.length);
    }
  });
});

describe("the provider's cookies (row 39)", () => {
  it('sends every cookie of a sign-in, login and consent included, HttpOnly and SameSite, with no Domain', async () => {
    const agent = createUserAgent();
    const seen: string[] = [];
    const request = agent.request.bind(agent);
    // Every answer of the flow goes through the agent: keep what each sets.
    const watched = {
      ...agent,
      async request(url: string, init?: RequestInit) {
        const step = await request(url, init);
        seen.push(...step.response.headers.getSetCookie());
        return step;
      },
    };
    watched.follow = async (url, stop = () => false) => {
      let step = await watched.request(url);
      for (let hops = 0; hops < 20; hops++) {
        const location = step.response.headers.get('location');
        if (!location || step.response.status < 300 || step.response.status > 399) return step;
        const next = new URL(location, step.url).href;
        if (stop(next)) return { ...step, url: next };
        step = await watched.request(next);
      }
      throw new Error('too many redirects');
    };
    watched.postForm = (url, fields, headers = {}) =>
      watched.request(url, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
        body: new URLSearchParams(fields),
      });
    const { tokens } = await codeFlow(auth(), app, alice, {}, watched);
    expect(tokens.status).toBe(200);
    const set = seen.filter((raw) => !/max-age=0|expires=thu, 01 jan 1970/i.test(raw));
    // The interaction's, the resume's, the sign-in session's and the login form's CSRF cookie at least.
    expect(set.length).toBeGreaterThanOrEqual(4);
    for (const raw of set) {
      expect(raw, raw.split('=')[0]).toMatch(/;\s*httponly/i);
      expect(raw, raw.split('=')[0]).toMatch(/;\s*samesite=(lax|strict)/i);
      expect(raw, raw.split('=')[0]).not.toMatch(/;\s*domain=/i);
    }
  });
});
