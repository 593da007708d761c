// A hostile user's and a hostile third party's requests against the whole reference app: each
// describe is a gap a security audit found (now closed), with what it needs set up and checked in a
// `beforeAll`, and a plain contrast case beside it showing the setup works.
import { randomUUID } from 'node:crypto';
import { sign } from '@idem/webhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createIdp } from '../src/idp/server.js';
import { type ListeningPort, listen } from '../src/listen.js';
import { loadWebhookSecret } from '../src/schema/api-schema.js';
import { authorizationUrl, codeFlow, loginAndConsent, openLoginForm, signOutOfApp } from './flow.js';
import { sendHostile } from './hostile-send.js';
import { alice, bob } from './test-idp.js';
import { startIdpBehindProxy, startWholeStack, type WholeStack } from './test-stack.js';
import { createUserAgent, formAction, formField, pkcePair, type UserAgent } from './user-agent.js';

let whole: WholeStack;

beforeAll(async () => {
  whole = await startWholeStack('hostile_security');
}, 120_000);

afterAll(async () => {
  await whole?.close();
});

describe('the gateway under a method it has no route for', () => {
  // The gateway's one route takes GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS, and the guard runs as
  // that route's `onRequest`. Any other method Node parses (PROPFIND, SEARCH, TRACE, LOCK, MKCOL, COPY,
  // ...) matches no route: Fastify's default not-found handler would answer it before the guard, as
  // JSON echoing the method and path. The gateway's own not-found handler runs the guard first.
  const unrouted = ['PROPFIND', 'SEARCH', 'TRACE', 'LOCK', 'MKCOL', 'COPY'];

  it.each(unrouted)(
    'answers %s without a token with 401 problem+json, before routing, echoing nothing',
    async (method) => {
      const answer = await sendHostile(
        { method, path: '/photos/%3Cb%3Eprobe%3C%2Fb%3E', headers: {} },
        whole.stack.gateway.url,
      );
      expect({ status: answer?.status, type: answer?.contentType.split(';')[0] }).toEqual({
        status: 401,
        type: 'application/problem+json',
      });
      expect(answer?.text).not.toContain('probe');
    },
  );

  it('answers a method it routes, without a token, with 401 problem+json (the contrast)', async () => {
    const answer = await sendHostile(
      { method: 'DELETE', path: '/photos/%3Cb%3Eprobe%3C%2Fb%3E', headers: {} },
      whole.stack.gateway.url,
    );
    expect(answer?.status).toBe(401);
    expect(answer?.contentType).toMatch(/^application\/problem\+json/);
    expect(answer?.text).not.toContain('probe');
  });
});

describe('the identity provider behind a TLS proxy (TRUST_PROXY=1) under a forged X-Forwarded-Host', () => {
  // Koa's `request.host` reads X-Forwarded-Host first when the provider trusts a proxy, and
  // `request.protocol` X-Forwarded-Proto; oidc-provider builds its URLs from them. A proxy that passes
  // the client's X-Forwarded-Host on (nginx does unless told otherwise) would let any client have
  // discovery advertise `https://evil.example/auth` and a `jwks_uri` on its own host, under the real
  // `issuer`. createIdp sets both from the issuer on every request.
  let proxied: ListeningPort;

  beforeAll(async () => {
    proxied = await startIdpBehindProxy(whole);
  });

  afterAll(async () => {
    await proxied?.close();
  });

  const discovery = async (headers: Record<string, string> = {}) => {
    const response = await fetch(new URL('/.well-known/openid-configuration', proxied.url), { headers });
    expect(response.status).toBe(200);
    return (await response.json()) as Record<string, unknown>;
  };

  it("advertises the issuer's own URLs to a client that sends no X-Forwarded-Host (the contrast)", async () => {
    const metadata = await discovery();
    expect(metadata.issuer).toBe(proxied.url);
    expect(metadata.authorization_endpoint).toBe(`${proxied.url}/auth`);
    expect(metadata.jwks_uri).toBe(`${proxied.url}/jwks`);
  });

  it("advertises the issuer's own URLs whatever X-Forwarded-Host and X-Forwarded-Proto a client sends", async () => {
    const metadata = await discovery({ 'x-forwarded-host': 'evil.example', 'x-forwarded-proto': 'https' });
    expect({ authorization: metadata.authorization_endpoint, jwks: metadata.jwks_uri }).toEqual({
      authorization: `${proxied.url}/auth`,
      jwks: `${proxied.url}/jwks`,
    });
  });
});

describe('the identity provider on an https issuer, behind a TLS proxy, with TRUST_PROXY left unset', () => {
  // `AUTH_URL=https://...` makes the issuer https. oidc-provider marks its cookies Secure only when it
  // reads the request as https (`ctx.secure`), and behind a proxy that ends TLS the request arrives over
  // plain http: without the scheme taken from the issuer, the sign-in session `_session` (12 hours) and
  // the interaction cookies would go out without Secure, and a browser would send them in clear on any
  // http:// request to the provider's host that an attacker on the network triggers.
  const issuer = 'https://idp.hostile-security.test';
  let port: ListeningPort;

  beforeAll(async () => {
    port = await listen(0);
    const idp = await createIdp({ db: whole.db, issuer, resource: whole.stack.gateway.baseUrl });
    port.use(idp.app);
  });

  afterAll(async () => {
    await port?.close();
  });

  /** The provider's URL as the browser knows it (the issuer's), sent to where it listens. */
  const local = (url: string) => new URL(new URL(url, issuer).pathname + new URL(url, issuer).search, port.url).href;

  /** alice's login up to the step that starts her session; every cookie the provider set on the way. */
  async function signInBehindTls() {
    const agent = createUserAgent();
    const cookies: string[] = [];
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
    const resumed = await agent.request(local(login.response.headers.get('location') ?? ''));
    keep(resumed);
    return cookies;
  }

  let cookies: string[];
  beforeAll(async () => {
    cookies = await signInBehindTls();
    // Over https the provider's session is a `__Host-` cookie (see session-security.audit.int.test.ts).
    expect(cookies.some((cookie) => cookie.startsWith('__Host-session='))).toBe(true);
  });

  it('marks the CSRF cookie of its own pages Secure (the contrast)', () => {
    expect(cookies.find((cookie) => cookie.startsWith('idp_csrf='))).toMatch(/;\s*Secure/i);
  });

  it('marks the sign-in session and interaction cookies Secure too', () => {
    const provider = cookies.filter(
      (cookie) =>
        /^(__Host-session|__Secure-interaction)/.test(cookie) && !/max-age=0|expires=thu, 01 jan 1970/i.test(cookie),
    );
    expect(provider.length).toBeGreaterThan(0);
    expect(provider.filter((cookie) => !/;\s*secure/i.test(cookie)).map((cookie) => cookie.split('=')[0])).toEqual([]);
  });
});

describe('password guessing at the login page', () => {
  // One sign-in's CSRF token stays valid for every attempt (it is bound to the interaction, not to an
  // attempt), so without a limit a script tries about fifty passwords a second per connection and is
  // let in at the first right one. OWASP ASVS 2.2.1 asks for anti-automation on authentication; spec
  // 5.10's slow hash only slows an offline attack. bob is guessed at: no other test here signs bob in.
  let agent: UserAgent;
  let loginUrl: string;
  let csrf: string;

  beforeAll(async () => {
    ({ agent, action: loginUrl, csrf } = await openLoginForm(whole.running.authUrl, whole.running.clients.app));
  });

  it('throttles a run of wrong passwords for one account: 429 with Retry-After from the eleventh', async () => {
    const statuses: number[] = [];
    let refused: Awaited<ReturnType<UserAgent['postForm']>> | undefined;
    for (let guess = 0; guess < 12; guess++) {
      // A client's X-Forwarded-For names no address of its own (TRUST_PROXY is unset): rotating it
      // does not start a fresh count.
      const answer = await agent.postForm(
        loginUrl,
        { csrf, username: 'bob', password: `guess-${guess}` },
        { 'x-forwarded-for': `203.0.113.${guess}` },
      );
      statuses.push(answer.response.status);
      if (answer.response.status === 429) refused = answer;
    }
    expect(statuses).toEqual([...Array(10).fill(200), 429, 429]);
    expect(Number(refused?.response.headers.get('retry-after'))).toBeGreaterThan(800);
    expect(refused?.body).toContain('Too many failed sign-ins');
    // Refused before any password is checked: the right one is no way in until the wait is over.
    const right = await agent.postForm(loginUrl, {
      csrf,
      username: 'BOB',
      password: bob.password,
    });
    expect(right.response.status).toBe(429);
  });
});

describe('signing out of the third-party app on a shared computer', () => {
  // The provider keeps a session in a persistent `_session` cookie (12 hours from the password). Were
  // the app's sign-out only its own, the next person at the computer would press "Sign in" and get the
  // consent page "Signed in as Alice Liddell": one click on Allow and they are in as alice, never
  // asked for a password. The app sends the browser through the provider's logout (RP-initiated logout) instead.
  let agent: UserAgent;

  beforeAll(async () => {
    agent = createUserAgent();
    const appUrl = (path: string) => new URL(path, whole.running.appUrl).href;
    const start = await agent.request(appUrl('/signin'));
    const callback = await loginAndConsent(
      agent,
      whole.running.authUrl,
      start.response.headers.get('location') ?? '',
      whole.running.clients.app.redirectUri,
      alice,
    );
    expect((await agent.request(callback.href)).response.status).toBe(303);
    const home = await agent.request(appUrl('/'));
    expect(home.body).toContain('Alice Liddell');
    const out = await signOutOfApp(agent, whole.running.appUrl, formField(home.body, 'csrf'));
    expect(out.body).toContain('You are signed out.');
  });

  it('asks for the password again when someone presses "Sign in" after alice signed out', async () => {
    const again = await agent.request(new URL('/signin', whole.running.appUrl).href);
    const page = await agent.follow(again.response.headers.get('location') ?? '');
    expect(page.body).toContain('<h1>Sign in</h1>');
    expect(page.body).not.toContain('Alice Liddell');
  });
});

describe("a note's Idempotency-Key under another spelling of the event id", () => {
  // The receiver's admin API finds the event by the id it decodes from the path, and @idem/koa (no
  // @koa/router there) names the operation by the path. `/webhook-events/evt_x/notes` and
  // `/webhook-events/evt%5Fx/notes` are one resource (RFC 3986 6.2.2.2), so one operation and one
  // fingerprint: a retry whose client, proxy or library spells the id the other way replays the first
  // note (the README's promise), never adds a second. Every event id the API makes holds `_`.
  let admin: string;
  let eventId: string;
  const key = `"${randomUUID()}"`;
  const body = Buffer.from(JSON.stringify({ text: 'Customer called about this one' }));

  const postNote = (path: string) =>
    sendHostile(
      {
        method: 'POST',
        path,
        headers: { authorization: `Bearer ${admin}`, 'content-type': 'application/json', 'idempotency-key': key },
        body,
      },
      whole.stack.gateway.url,
    );

  const notes = async () => {
    const response = await fetch(new URL(`/webhook-events/${eventId}`, whole.stack.gateway.url), {
      headers: { authorization: `Bearer ${admin}` },
    });
    expect(response.status).toBe(200);
    return ((await response.json()) as { notes: unknown[] }).notes;
  };

  beforeAll(async () => {
    // An event the receiver applied, signed as the API signs them.
    eventId = `evt_ch_${randomUUID()}`;
    const event = JSON.stringify({
      type: 'payment.succeeded',
      data: { id: eventId.slice(4), amount: 700, currency: 'EUR' },
    });
    const headers = sign({
      id: eventId,
      timestamp: Math.floor(Date.now() / 1000),
      body: event,
      secret: await loadWebhookSecret(whole.db),
    });
    const delivered = await fetch(whole.stack.receiver.webhookUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: event,
    });
    expect(delivered.status).toBe(200);
    // alice, an admin, through a client she let act with her role on the events.
    const flow = await codeFlow(whole.running.authUrl, whole.running.clients.app, alice, {
      scope: 'openid events:read events:write',
    });
    expect(flow.tokens.status).toBe(200);
    admin = flow.tokens.body.access_token as string;
    // The first attempt, spelled as the API spells the id.
    expect((await postNote(`/webhook-events/${eventId}/notes`))?.status).toBe(201);
    expect(await notes()).toHaveLength(1);
  });

  it('replays the first note to a retry spelled the same way (the contrast)', async () => {
    const retry = await postNote(`/webhook-events/${eventId}/notes`);
    expect(retry?.status).toBe(201);
    expect(retry?.headers['idempotent-replayed']).toBe('true');
    expect(await notes()).toHaveLength(1);
  });

  it('replays the first note to a retry that percent-encodes the same id', async () => {
    const retry = await postNote(`/webhook-events/${eventId.replaceAll('_', '%5F')}/notes`);
    expect(retry?.status).toBe(201);
    expect(retry?.headers['idempotent-replayed']).toBe('true');
    expect(await notes()).toHaveLength(1);
  });
});
