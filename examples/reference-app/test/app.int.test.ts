import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type RequestListener, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { format, inspect } from 'node:util';
import { afterAll, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { migrateApp } from '../src/app/schema.js';
import { openTokens } from '../src/app/sealed-tokens.js';
import { createThirdPartyApp, type ThirdPartyAppEvent } from '../src/app/server.js';
import { createSessionStore } from '../src/app/sessions.js';
import { type Database, openDatabase } from '../src/db.js';
import { migrateIdp } from '../src/idp/schema.js';
import { createIdp } from '../src/idp/server.js';
import { storedId } from '../src/idp/stored-id.js';
import { type ListeningPort, listen } from '../src/listen.js';
import { seed } from '../src/seed.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { introspect, loginAndConsent, signOutOfApp, tokenRequest } from './flow.js';
import { openTestDatabase } from './services.js';
import { writeSession } from './store-write.js';
import { alice } from './test-idp.js';
import { createUserAgent, decodeJwt, formAction, formField, type UserAgent, withoutSendOnce } from './user-agent.js';

interface SeenRequest {
  method: string;
  url: string;
  authorization: string | undefined;
  idempotencyKey: string | undefined;
  body: string;
}

/** A stand-in for the gateway: a real HTTP server that records what the app sends it. */
let api: Server;
let apiUrl: string;
let apiMode:
  | 'ok'
  | 'down'
  | 'flaky'
  | 'refuse'
  | 'busy'
  | 'crash'
  | 'drop'
  | 'garbled'
  | 'moved'
  | 'moved-reads'
  | 'key-taken' = 'ok';
/** In 'flaky' mode, how many more POST /charges answer 503 before one succeeds. */
let failuresLeft = 0;
/** The waits the app's client asked for between charge attempts (sleep is injected: nothing waits). */
const waits: number[] = [];
const seen: SeenRequest[] = [];
/** What the app reported through its `onEvent`. */
const appEvents: ThirdPartyAppEvent[] = [];
/** Runs while the app's client waits before a charge's retry (a test moves the clock there). */
let duringRetryWait: (() => void) | undefined;
/** The next API request matching `method` and `url` waits here until the test releases it. */
let apiHold: { method: string; url: string; reached: () => void; opened: Promise<void> } | undefined;

/** Holds the API's next `method` `url` request; `reached` resolves once it is held. */
function holdApi(method: string, url: string) {
  let release = () => {};
  const opened = new Promise<void>((resolve) => {
    release = resolve;
  });
  const reached = new Promise<void>((resolve) => {
    apiHold = { method, url, reached: resolve, opened };
  });
  return { reached, release };
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve) => {
    let data = '';
    req.on('data', (chunk) => {
      data += chunk;
    });
    req.on('end', () => resolve(data));
  });
}

/**
 * Wraps a database so a test can stop one statement (the first that `match` picks) just before it
 * runs, with every other statement going on: two requests in flight, interleaved where the test says.
 */
function statementGate(inner: Database) {
  type Held = {
    match: (text: string, params: readonly unknown[]) => boolean;
    reached: (params: readonly unknown[]) => void;
    opened: Promise<void>;
  };
  let armed: Held | undefined;
  let armedAfter: Held | undefined;
  const db: Database = {
    ...inner,
    async query<Row>(text: string, params: readonly unknown[] = []) {
      const held = armed;
      if (held?.match(text, params)) {
        armed = undefined;
        held.reached(params);
        await held.opened;
      }
      const after = armedAfter;
      if (after?.match(text, params)) {
        armedAfter = undefined;
        const result = await inner.query<Row>(text, params);
        after.reached(params);
        await after.opened;
        return result;
      }
      return inner.query<Row>(text, params);
    },
  };
  const arm = (match: Held['match'], set: (held: Held) => void) => {
    let release = () => {};
    const opened = new Promise<void>((resolve) => {
      release = resolve;
    });
    const reached = new Promise<readonly unknown[]>((resolve) => {
      set({ match, reached: resolve, opened });
    });
    return { reached, release };
  };
  return {
    db,
    /** Arms the gate; `reached` resolves with the statement's parameters once it is held. */
    hold: (match: Held['match']) =>
      arm(match, (held) => {
        armed = held;
      }),
    /** The same, but the statement runs first and its result is held: a read that goes stale. */
    holdAfter: (match: Held['match']) =>
      arm(match, (held) => {
        armedAfter = held;
      }),
  };
}

let db: Database;
/** Holds one chosen statement of the app or the provider on the shared database until released. */
let gate: ReturnType<typeof statementGate>;
let running: RunningReferenceApp;
let clock = 0;
const sessions = () => createSessionStore(db, { ttlSeconds: 3600 });

beforeAll(async () => {
  api = createServer(async (req, res) => {
    const body = await readBody(req);
    seen.push({
      method: req.method ?? '',
      url: req.url ?? '',
      authorization: req.headers.authorization,
      idempotencyKey: req.headers['idempotency-key'] as string | undefined,
      body,
    });
    const held = apiHold;
    if (held && held.method === req.method && held.url === req.url) {
      apiHold = undefined;
      held.reached();
      await held.opened;
    }
    if (apiMode === 'down' || (apiMode === 'flaky' && req.url === '/charges' && failuresLeft-- > 0)) {
      res.writeHead(503, { 'content-type': 'application/problem+json' }).end('{"title":"Service Unavailable"}');
      return;
    }
    if (apiMode === 'busy' && req.url === '/charges') {
      // The first attempt of this key still running, as the API answers it.
      res
        .writeHead(409, { 'content-type': 'application/problem+json', 'retry-after': '1' })
        .end('{"title":"Request in progress"}');
      return;
    }
    // A 500 (retried with a key), no answer at all, or a success whose body does not parse.
    if (apiMode === 'crash' && req.url === '/charges') {
      res.writeHead(500, { 'content-type': 'application/problem+json' }).end('{"title":"Internal Server Error"}');
      return;
    }
    if (apiMode === 'drop' && req.url === '/charges') {
      req.socket.destroy();
      return;
    }
    if (apiMode === 'garbled' && req.url === '/charges') {
      res.writeHead(201, { 'content-type': 'application/json' }).end('{"id":"ch_1",');
      return;
    }
    // A 303 to the charge, or to the settings (an API or a proxy in front of it that answers a write
    // so): no 2xx, and no refusal either; the client does not follow a write's redirect.
    if (apiMode === 'moved' && (req.url === '/charges' || (req.method === 'PUT' && req.url === '/settings'))) {
      res.writeHead(303, { location: '/charges/ch_1' }).end();
      return;
    }
    // A 303 to the home page's reads (a proxy in front of the API redirecting them, say to a sign-in).
    if (apiMode === 'moved-reads' && req.method === 'GET') {
      res.writeHead(303, { location: '/elsewhere' }).end();
      return;
    }
    // The key stands for another charge, as an engine with `mismatchStatus: 400` answers (spec part 7).
    if (apiMode === 'key-taken' && req.url === '/charges') {
      res
        .writeHead(400, { 'content-type': 'application/problem+json' })
        .end('{"title":"Idempotency-Key is already used with another request","code":"idempotency_error"}');
      return;
    }
    if (apiMode === 'refuse' && req.url === '/charges' && failuresLeft-- > 0) {
      res.writeHead(503, { 'content-type': 'application/problem+json' }).end('{"title":"Service Unavailable"}');
      return;
    }
    if (apiMode === 'refuse' && req.url === '/charges') {
      res.writeHead(422, { 'content-type': 'application/problem+json' }).end('{"title":"Unprocessable Content"}');
      return;
    }
    const json = (status: number, value: unknown, headers: Record<string, string> = {}) =>
      res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(value));
    if (req.url === '/photos') return json(200, [{ id: 'p1', title: 'Alice at the tea party' }]);
    if (req.url?.startsWith('/stock')) return json(200, { item: req.url.split('=')[1], level: 7 });
    if (req.url === '/settings') return json(200, req.method === 'PUT' ? JSON.parse(body) : { theme: 'light' });
    // Like the real API, echo the key the request carried.
    if (req.url === '/charges') {
      return json(
        201,
        { id: 'ch_1', ...JSON.parse(body) },
        { 'idempotency-key': String(req.headers['idempotency-key']) },
      );
    }
    return json(404, { title: 'Not Found' });
  });
  await new Promise<void>((resolve) => api.listen(0, '127.0.0.1', resolve));
  apiUrl = `http://127.0.0.1:${(api.address() as AddressInfo).port}`;

  gate = statementGate(await openTestDatabase('app'));
  db = gate.db;
  running = await startReferenceApp({
    db,
    authPort: 0,
    appPort: 0,
    baseUrl: apiUrl,
    now: () => Date.now() + clock,
    onAppEvent: (event) => appEvents.push(event),
    retryTiming: {
      random: () => 0.5,
      sleep: async (ms) => {
        waits.push(ms);
        duringRetryWait?.();
      },
    },
  });
});

afterAll(async () => {
  await running?.close();
  await db?.close();
  await new Promise<void>((resolve) => (api ? api.close(() => resolve()) : resolve()));
});

beforeEach(() => {
  apiMode = 'ok';
  failuresLeft = 0;
  clock = 0;
  seen.length = 0;
  waits.length = 0;
  appEvents.length = 0;
  duringRetryWait = undefined;
  apiHold = undefined;
});

const appUrl = (path = '/') => new URL(path, running.appUrl).href;
/** The page a form's post/redirect/get lands on (`/?shown=<slot>`): where its message is shown. */
const landing = (agent: UserAgent, posted: { response: Response }) =>
  agent.request(appUrl(posted.response.headers.get('location') ?? '/'));
const callbackPrefix = () => new URL('/callback', running.appUrl).href;

/** Starts at the app, returns the provider's redirect back to the app's callback (not yet followed). */
async function throughProvider(agent: UserAgent, start = '/signin', user = alice): Promise<URL> {
  return loginAndConsent(agent, running.authUrl, appUrl(start), callbackPrefix(), user);
}

async function signIn(start = '/signin') {
  const agent = createUserAgent();
  const callback = await throughProvider(agent, start);
  const landed = await agent.request(callback.href);
  return { agent, callback, landed };
}

const sessionId = (agent: UserAgent) => agent.jar.cookies.get('app_session')?.value;
/** The row of a session id: the table keys rows by the id's SHA-256. */
const sessionRow = async (id: string | undefined) =>
  (
    await db.query<{ expires_at: Date; left: number }>(
      `select expires_at, extract(epoch from expires_at - now())::float8 as left from app_sessions where id_hash = $1`,
      [createHash('sha256').update(String(id)).digest('base64url')],
    )
  ).rows[0];

/** "Sign in" when signed in already: the page asks, and its form posts back with the CSRF token. */
async function signInAgain(agent: UserAgent, url: (path: string) => string = appUrl) {
  const asked = await agent.request(url('/signin'));
  expect(asked.response.status).toBe(200);
  expect(formAction(asked.body, 'signin')).toBe('/signin');
  return agent.postForm(url('/signin'), {
    csrf: formField(asked.body, 'csrf'),
    return_to: formField(asked.body, 'return_to'),
  });
}
const codeRow = async (code: string) =>
  (
    await db.query<{ consumed_at: Date | null }>(
      `select consumed_at from idp_models where model = 'AuthorizationCode' and id = $1`,
      [storedId('AuthorizationCode', code)],
    )
  ).rows[0];

/**
 * The app and a provider of their own, on a database of their own, for the tests that take the
 * provider's revocation away (the shared provider must keep answering the other tests). `revocation`
 * says how its revocation endpoint answers: as usual, 503, or 400 with the token echoed in the
 * `error_description` (no provider should; it shows that the app's log prints nothing of the answer).
 * `stop()` closes its port, so that it cannot be reached at all, until `restore()`. `onEvent` is the
 * app's, or its default when not given.
 */
async function startOwnProvider(onEvent?: (event: ThirdPartyAppEvent) => void) {
  const ownDb = await openTestDatabase('app_own_idp');
  const ports: ListeningPort[] = [];
  try {
    const authPort = await listen(0);
    const appPort = await listen(0);
    ports.push(authPort, appPort);
    await migrateIdp(ownDb);
    await migrateApp(ownDb);
    const clients = await seed(ownDb, { appRedirectUri: new URL('/callback', appPort.url).href });
    const idp = await createIdp({ db: ownDb, issuer: authPort.url, resource: apiUrl });
    const own = {
      db: ownDb,
      authUrl: authPort.url,
      clients,
      revocation: 'ok' as 'ok' | 'unavailable' | 'echo',
      url: (path: string) => new URL(path, appPort.url).href,
      /** Signs alice in to the app in a fresh browser; returns it, its session id and the tokens stored. */
      async signIn() {
        const agent = createUserAgent();
        const callback = await loginAndConsent(agent, authPort.url, own.url('/signin'), own.url('/callback'), alice);
        await agent.request(callback.href);
        const id = sessionId(agent)!;
        const tokens = (await createSessionStore(ownDb, { ttlSeconds: 60 }).get(id))?.tokens;
        expect(tokens?.refreshToken).toEqual(expect.any(String));
        return { agent, id, tokens: tokens! };
      },
      async stop() {
        const stopped = provider;
        if (!stopped) return;
        provider = undefined;
        ports.splice(ports.indexOf(stopped), 1);
        await stopped.close();
      },
      /** The provider answers as usual again, on the same port if it was stopped. */
      async restore() {
        own.revocation = 'ok';
        if (provider) return;
        provider = await listen(authPort.port);
        ports.push(provider);
        provider.use(handler);
      },
      async close() {
        await Promise.allSettled(ports.map((port) => port.close()));
        await ownDb.close();
      },
    };
    const handler: RequestListener = async (req, res) => {
      if (own.revocation === 'ok' || !req.url?.startsWith('/token/revocation')) {
        idp.app(req, res);
      } else if (own.revocation === 'unavailable') {
        res.writeHead(503).end();
      } else {
        const token = new URLSearchParams(await readBody(req)).get('token');
        res
          .writeHead(400, { 'content-type': 'application/json' })
          .end(JSON.stringify({ error: 'invalid_request', error_description: `cannot revoke ${token}` }));
      }
    };
    let provider: ListeningPort | undefined = authPort;
    authPort.use(handler);
    const { app } = await createThirdPartyApp({
      db: ownDb,
      issuer: authPort.url,
      clientId: clients.app.clientId,
      clientSecret: clients.app.clientSecret,
      appUrl: appPort.url,
      baseUrl: apiUrl,
      ...(onEvent ? { onEvent } : {}),
    });
    appPort.use(app);
    return own;
  } catch (error) {
    await Promise.allSettled(ports.map((port) => port.close()));
    await ownDb.close();
    throw error;
  }
}
type OwnProvider = Awaited<ReturnType<typeof startOwnProvider>>;

/** Events as anyone could serialise them: JSON, and inspect down to an error's message, stack and cause. */
const serialised = (events: unknown) =>
  `${JSON.stringify(events)}\n${inspect(events, { showHidden: true, depth: 10 })}`;

/** How a revocation fails in the tests below: the README's "the provider cannot be reached", and a 5xx. */
const revocationFailures: Array<[string, (own: OwnProvider) => unknown]> = [
  ['cannot be reached (its port is closed)', (own) => own.stop()],
  [
    'answers 503',
    (own) => {
      own.revocation = 'unavailable';
    },
  ],
];
// No provider should quote the token back, but the app's promise ("never the token") must not rest on that.
const tokenEchoed: [string, (own: OwnProvider) => unknown] = [
  'answers 400 and echoes the token',
  (own) => {
    own.revocation = 'echo';
  },
];

describe('sign in', () => {
  it('starts the code flow with state, nonce, PKCE S256 and the API resource', async () => {
    const agent = createUserAgent();
    const step = await agent.request(appUrl('/signin'));
    expect(step.response.status).toBe(303);
    const location = new URL(step.response.headers.get('location')!);
    expect(location.origin + location.pathname).toBe(`${running.authUrl}/auth`);
    const params = location.searchParams;
    expect(params.get('response_type')).toBe('code');
    expect(params.get('client_id')).toBe(running.clients.app.clientId);
    expect(params.get('redirect_uri')).toBe(callbackPrefix());
    expect(params.get('state')).toMatch(/^[\w-]{43}$/);
    expect(params.get('nonce')).toMatch(/^[\w-]{43}$/);
    expect(params.get('code_challenge')).toMatch(/^[\w-]{43}$/);
    expect(params.get('code_challenge_method')).toBe('S256');
    expect(params.get('resource')).toBe(apiUrl);
    // The client secret is used server-to-server only (spec 2.3): never in what the browser sees.
    expect(params.has('client_secret')).toBe(false);
    expect(location.href).not.toContain(encodeURIComponent(running.clients.app.clientSecret));
    expect(location.href).not.toContain(running.clients.app.clientSecret);
    // Only what the app uses (spec 5.7): it reads photos, stock and settings, sets the theme and
    // creates charges. It never adds or deletes photos, nor acts with the user's admin role.
    expect(params.get('scope')?.split(' ').sort()).toEqual([
      'charges:write',
      'email',
      'offline_access',
      'openid',
      'photos:read',
      'profile',
      'settings:read',
      'settings:write',
      'stock:read',
    ]);
    const cookie = agent.jar.cookies.get('app_session')?.raw ?? '';
    expect(cookie).toMatch(/HttpOnly/);
    expect(cookie).toMatch(/SameSite=Lax/);
  });

  it('takes the password at the provider only: no request to the app carries it (spec 5.6 b)', async () => {
    const authOrigin = new URL(running.authUrl).origin;
    const appOrigin = new URL(running.appUrl).origin;
    const login = await createUserAgent().follow(appUrl('/signin'), (url) => url.startsWith(callbackPrefix()));
    expect(new URL(login.url).origin).toBe(authOrigin);
    expect(login.body).toContain('<h1>Sign in</h1>');
    // Resolved against the page, as a browser does: the form posts to the provider.
    expect(new URL(formAction(login.body, 'login'), login.url).origin).toBe(authOrigin);
    const sent: Array<{ url: string; text: string }> = [];
    const realFetch = globalThis.fetch;
    const recorder = vi.spyOn(globalThis, 'fetch').mockImplementation((input, init) => {
      const url = input instanceof Request ? input.url : String(input);
      const headers: string[] = [];
      new Headers(init?.headers).forEach((value, name) => {
        headers.push(`${name}: ${value}`);
      });
      sent.push({ url, text: `${url} ${headers.join('\n')} ${String(init?.body ?? '')}` });
      return realFetch(input, init);
    });
    let landed: Awaited<ReturnType<typeof signIn>>['landed'];
    try {
      ({ landed } = await signIn());
    } finally {
      recorder.mockRestore();
    }
    expect(landed.response.status).toBe(303);
    const password = new URLSearchParams({ p: alice.password }).toString().slice(2);
    // The recorder sees the password where it goes, the provider: it would see it anywhere else too.
    expect(sent.some(({ url, text }) => new URL(url).origin === authOrigin && text.includes(password))).toBe(true);
    const toApp = sent.filter(({ url }) => new URL(url).origin === appOrigin);
    expect(toApp.length).toBeGreaterThan(1);
    for (const { text } of toApp) {
      expect(text).not.toContain(password);
      expect(text).not.toContain(alice.password);
    }
  });

  it('signs in through the provider, sets a new HttpOnly SameSite=Lax session and shows the user (rows 35, 39)', async () => {
    const agent = createUserAgent();
    const callback = await throughProvider(agent);
    const beforeLogin = sessionId(agent);
    expect(beforeLogin).toEqual(expect.any(String));
    const landed = await agent.request(callback.href);
    expect(landed.response.status).toBe(303);
    expect(landed.response.headers.get('location')).toBe('/');
    expect(landed.response.headers.get('referrer-policy')).toBe('no-referrer');
    const raw = agent.jar.cookies.get('app_session')?.raw ?? '';
    expect(raw).toMatch(/HttpOnly/);
    expect(raw).toMatch(/SameSite=Lax/);
    expect(sessionId(agent)).not.toBe(beforeLogin);
    // The sign-in's own session row is gone, not left to expire: an id planted before the sign-in
    // (session fixation) names nothing afterwards, not even the other tabs' pending transactions.
    expect(await sessionRow(beforeLogin)).toBeUndefined();

    const page = await agent.request(appUrl('/'));
    expect(page.response.status).toBe(200);
    expect(page.body).toContain('Alice Liddell');
    expect(page.body).toContain('alice@example.com');
    expect(page.body).toContain('user-alice');
    expect(page.response.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    expect(page.response.headers.get('referrer-policy')).toBe('no-referrer');
    // Nothing from a third party (row 38), and no script but the one every page has (a form is sent once).
    expect(withoutSendOnce(page.body)).not.toMatch(/<script|@import|https?:\/\/(?!localhost|127\.0\.0\.1)/);

    // Tokens stay on the server: not in the page, not in the cookie, not in any URL the browser saw.
    const stored = await sessions().get(sessionId(agent));
    expect(stored?.tokens?.accessToken).toEqual(expect.any(String));
    expect(page.body).not.toContain(stored!.tokens!.accessToken);
    expect(page.body).not.toContain(stored!.tokens!.refreshToken!);
    expect(sessionId(agent)).not.toContain('.');
    // The table keeps only a hash of the cookie value.
    const { rows } = await db.query<{ id_hash: string }>('select id_hash from app_sessions');
    expect(rows.map((row) => row.id_hash)).not.toContain(sessionId(agent));
  });

  it.each([
    ['does not match', (url: URL) => url.searchParams.set('state', 'forged-state')],
    ['is missing', (url: URL) => url.searchParams.delete('state')],
  ])('refuses a callback whose state %s, before any token request (row 32)', async (_name, tamper) => {
    const agent = createUserAgent();
    const callback = await throughProvider(agent);
    const code = callback.searchParams.get('code')!;
    tamper(callback);
    const step = await agent.request(callback.href);
    expect(step.response.status).toBe(400);
    expect(step.body).toContain('Sign-in failed');
    expect((await codeRow(code))?.consumed_at).toBeNull();
  });

  it('marks the session cookie Secure and names it __Host- when the app is served over https (row 39)', async () => {
    const port = await listen(0);
    try {
      const { app } = await createThirdPartyApp({
        db,
        issuer: running.authUrl,
        clientId: running.clients.app.clientId,
        clientSecret: running.clients.app.clientSecret,
        appUrl: 'https://app.example',
        baseUrl: apiUrl,
      });
      port.use(app);
      const agent = createUserAgent();
      const step = await agent.request(new URL('/signin', port.url).href);
      expect(step.response.status).toBe(303);
      // The prefix keeps a cookie planted by a sibling subdomain out: browsers take it only from this
      // origin, Secure, with Path=/ and no Domain.
      expect(agent.jar.cookies.get('app_session')).toBeUndefined();
      const raw = agent.jar.cookies.get('__Host-app_session')?.raw ?? '';
      expect(raw).toMatch(/;\s*Secure/i);
      expect(raw).toMatch(/HttpOnly/);
      expect(raw).toMatch(/SameSite=Lax/);
      expect(raw).toMatch(/;\s*Path=\/(;|$)/);
      expect(raw).not.toMatch(/Domain=/i);
      // The app reads it back by that name: a second sign-in of the same browser (another tab) adds
      // its transaction to the pending session the cookie names.
      const oldId = agent.jar.cookies.get('__Host-app_session')?.value;
      const store = createSessionStore(db, { ttlSeconds: 60 });
      expect((await store.get(oldId))?.pending).toHaveLength(1);
      expect((await agent.request(new URL('/signin', port.url).href)).response.status).toBe(303);
      expect((await store.get(oldId))?.pending).toHaveLength(2);
    } finally {
      await port.close();
    }
  });

  it.each([
    ['another issuer', (url: URL) => url.searchParams.set('iss', 'https://evil.example')],
    ['no iss at all', (url: URL) => url.searchParams.delete('iss')],
  ])('refuses a callback with %s (row 33)', async (_name, tamper) => {
    const agent = createUserAgent();
    const callback = await throughProvider(agent);
    tamper(callback);
    const step = await agent.request(callback.href);
    expect(step.response.status).toBe(400);
    expect((await codeRow(callback.searchParams.get('code')!))?.consumed_at).toBeNull();
  });

  it('refuses a replayed callback: the transaction is used once (row 35)', async () => {
    const agent = createUserAgent();
    const callback = await throughProvider(agent);
    const pendingCookie = sessionId(agent);
    const first = await agent.request(callback.href);
    expect(first.response.status).toBe(303);
    const replay = await fetch(callback, { headers: { cookie: `app_session=${pendingCookie}` }, redirect: 'manual' });
    expect(replay.status).toBe(400);
  });

  it('shows a cancelled sign-in when the user denies consent', async () => {
    const agent = createUserAgent();
    let step = await agent.follow(appUrl('/signin'), (url) => url.startsWith(callbackPrefix()));
    const login = await agent.postForm(new URL(formAction(step.body, 'login'), running.authUrl).href, {
      csrf: formField(step.body, 'csrf'),
      ...alice,
    });
    step = await agent.follow(new URL(login.response.headers.get('location')!, running.authUrl).href);
    const deny = await agent.postForm(new URL(formAction(step.body, 'abort'), running.authUrl).href, {
      csrf: formField(step.body, 'csrf'),
    });
    expect(deny.response.status).toBe(303);
    const back = await agent.follow(new URL(deny.response.headers.get('location')!, running.authUrl).href);
    expect(back.response.status).toBe(400);
    expect(back.body).toContain('You cancelled the sign-in.');
  });

  it('asks a signed-in user first: a GET from another site ends neither the session nor its grant (sign-in CSRF)', async () => {
    const { agent } = await signIn();
    const id = sessionId(agent);
    const stored = await sessions().get(id);
    // A top-level GET from another site carries the SameSite=Lax cookie.
    const forced = await agent.request(appUrl('/signin?return_to=%2Fphotos'), {
      headers: { 'sec-fetch-site': 'cross-site', 'sec-fetch-mode': 'navigate' },
    });
    expect(forced.response.status).toBe(200);
    expect(forced.response.headers.get('cache-control')).toBe('no-store');
    expect(forced.body).toContain('<h1>Sign in again</h1>');
    expect(forced.body).toContain('<form method="post" action="/signin">');
    expect(formField(forced.body, 'return_to')).toBe('/photos');
    // The user never finished a new sign-in: their session and their grant survive.
    expect(sessionId(agent)).toBe(id);
    expect(await sessions().get(id)).toEqual(stored);
    expect((await agent.request(appUrl('/'))).body).toContain('Alice Liddell');
    const refresh = await tokenRequest(
      running.authUrl,
      { grant_type: 'refresh_token', refresh_token: stored!.tokens!.refreshToken! },
      running.clients.app,
    );
    expect(refresh.status).toBe(200);
  });

  it('a request that read the session before another refreshed it does not refresh again with the used token', async () => {
    const { agent } = await signIn();
    const id = sessionId(agent);
    clock = 301_000;
    // This request reads the expired tokens; its read is held until the other request has refreshed
    // them, stored the rotated ones, and finished.
    // (The store's read: one statement that also records the session's use, `sessions.ts`.)
    const stale = gate.holdAfter((text) => /^with seen as .*\bselect data from app_sessions\b/s.test(text));
    const late = agent.request(appUrl('/'));
    await stale.reached;
    const first = await agent.request(appUrl('/'));
    expect(first.body).toContain('Alice Liddell');
    const refreshed = await sessions().get(id);
    stale.release();
    expect((await late).body).toContain('Alice Liddell');
    clock = 0;
    // Read again before its refresh, the session held fresh tokens: the late request used them and
    // refreshed nothing (a second rotation would be a refresh for nothing, one more chance to race).
    const now = await sessions().get(id);
    expect(now?.tokens).toEqual(refreshed?.tokens);
    // Had the late request presented the used refresh token, the provider would have ended the grant.
    expect(now?.tokens?.refreshToken).toEqual(expect.any(String));
    const refresh = await tokenRequest(
      running.authUrl,
      { grant_type: 'refresh_token', refresh_token: now!.tokens!.refreshToken! },
      running.clients.app,
    );
    expect(refresh.status).toBe(200);
  });

  it("refuses a new sign-in posted without the session's CSRF token", async () => {
    const { agent } = await signIn();
    const id = sessionId(agent);
    const forged = await agent.postForm(appUrl('/signin'), { return_to: '/' });
    expect(forged.response.status).toBe(403);
    expect(sessionId(agent)).toBe(id);
    expect((await agent.request(appUrl('/'))).body).toContain('Alice Liddell');
  });

  it('keeps an abandoned sign-in 15 minutes, and a later sign-in deletes its row once expired', async () => {
    const abandoned = createUserAgent();
    expect((await abandoned.request(appUrl('/signin'))).response.status).toBe(303);
    const row = await sessionRow(sessionId(abandoned));
    expect(row?.left).toBeGreaterThan(14 * 60);
    expect(row?.left).toBeLessThanOrEqual(15 * 60);
    // A signed-in session gets the full 8 hours.
    const { agent } = await signIn();
    expect((await sessionRow(sessionId(agent)))?.left).toBeGreaterThan(7 * 3600);
    // Expired (the database's clock cannot be moved: the row is aged instead) ...
    await db.query(`update app_sessions set expires_at = now() - interval '1 second' where id_hash = $1`, [
      createHash('sha256')
        .update(String(sessionId(abandoned)))
        .digest('base64url'),
    ]);
    expect(await sessions().get(sessionId(abandoned))).toBeUndefined();
    // ... and gone after the next visitor's "Sign in", not left to pile up.
    expect((await createUserAgent().request(appUrl('/signin'))).response.status).toBe(303);
    expect(await sessionRow(sessionId(abandoned))).toBeUndefined();
    expect(await sessionRow(sessionId(agent))).toBeDefined();
  });

  // Was wrong: each use (a form, a token refresh) extended a signed-in session by its full 8 hours,
  // with no limit: a session in use, or a stolen cookie replayed now and then, never ended (OWASP ASVS
  // 3.3.2). Now it ends 12 hours after the sign-in however much it is used, by the database's clock
  // from a creation time only the server holds, and is then answered as an idle-expired one.
  it('ends a signed-in session 12 hours after the sign-in however much it is used, as an idle one ends', async () => {
    const { agent } = await signIn();
    const id = sessionId(agent);
    const hash = createHash('sha256').update(String(id)).digest('base64url');
    // Signed in 11 hours 59 minutes ago (the database's clock cannot be moved: the row is aged).
    await db.query(`update app_sessions set created_at = now() - interval '11 hours 59 minutes' where id_hash = $1`, [
      hash,
    ]);
    const page = await agent.request(appUrl('/'));
    expect(page.body).toContain('Alice Liddell');
    const theme = await agent.postForm(appUrl('/theme'), { csrf: formField(page.body, 'csrf'), theme: 'dark' });
    expect(theme.response.headers.get('location')).toMatch(/^\/\?shown=/);
    // Used just now, yet a minute left at most: the use did not extend it past its lifetime.
    expect((await sessionRow(id))?.left).toBeLessThanOrEqual(60);
    // Past it, whatever its last use: the signed-out page, the cookie cleared, a form not sent.
    await db.query(`update app_sessions set created_at = now() - interval '12 hours 1 second' where id_hash = $1`, [
      hash,
    ]);
    const form = await agent.request(appUrl('/'));
    expect(form.body).not.toContain('Alice Liddell');
    expect(form.body).toContain('href="/signin"');
    expect(sessionId(agent)).toBeUndefined();
    agent.jar.cookies.set('app_session', { value: String(id), raw: `app_session=${id}` });
    const late = await agent.postForm(appUrl('/theme'), { csrf: formField(page.body, 'csrf'), theme: 'light' });
    expect(late.response.headers.get('location')).toBe('/?state=form-not-sent');
  });

  it.each([
    ['//evil.example/x', '/'],
    ['https://evil.example/', '/'],
    ['/\\evil.example', '/'],
    ['/?tab=photos', '/?tab=photos'],
  ])('returns to %s as %s after sign-in, never to another origin (row 37)', async (returnTo, expected) => {
    const { landed } = await signIn(`/signin?return_to=${encodeURIComponent(returnTo)}`);
    expect(landed.response.headers.get('location')).toBe(expected);
  });
});

describe('the signed-out page', () => {
  it("says a sentence only for the app's own states, never a member every object has", async () => {
    // `state` is the query anyone can link with: looked up in a plain object, `constructor` or
    // `toString` found Object's own functions, and the page printed their source as its notice.
    const linked = async (state: string) => (await fetch(appUrl(`/?state=${state}`))).text();
    expect(await linked('signed-out')).toContain('<p role="status">You are signed out.</p>');
    for (const state of ['constructor', 'toString', '__proto__', 'hasOwnProperty']) {
      expect(await linked(state), state).not.toContain('role="status"');
    }
  });
});

describe('signed in', () => {
  it('calls the API with the bearer token in the header, bound to the API audience', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    expect(page.body).toContain('Alice at the tea party');
    const photos = seen.find((request) => request.url === '/photos');
    expect(photos?.authorization).toMatch(/^Bearer /);
    const { header, payload } = decodeJwt(photos!.authorization!.slice('Bearer '.length));
    expect(header.typ).toBe('at+jwt');
    expect(payload.aud).toBe(apiUrl);
    expect(payload.sub).toBe('user-alice');
    for (const request of seen) expect(request.url).not.toMatch(/access_token/);
  });

  it.each([
    [
      'answers 503',
      () => {
        apiMode = 'down';
      },
    ],
  ])('shows "API unavailable", never a 500, when the API %s', async (_name, breakIt) => {
    const { agent } = await signIn();
    breakIt();
    const page = await agent.request(appUrl('/'));
    expect(page.response.status).toBe(200);
    expect(page.body).toContain('API unavailable');
    expect(page.body).toContain('Alice Liddell');
  });

  it('shows "API unavailable" when nothing listens at the base URL', async () => {
    const other = await openTestDatabase('app_closed_api');
    const closed = await startReferenceApp({ db: other, authPort: 0, appPort: 0, baseUrl: 'http://127.0.0.1:9' });
    try {
      const agent = createUserAgent();
      const callback = await loginAndConsent(
        agent,
        closed.authUrl,
        new URL('/signin', closed.appUrl).href,
        new URL('/callback', closed.appUrl).href,
        alice,
      );
      await agent.request(callback.href);
      const page = await agent.request(new URL('/', closed.appUrl).href);
      expect(page.response.status).toBe(200);
      expect(page.body.match(/API unavailable/g)?.length).toBe(3);
    } finally {
      await closed.close();
      await other.close();
    }
  });

  it("deletes the provider's expired rows on a timer, and only those, until it is closed", async () => {
    const own = await openTestDatabase('app_purge');
    // Only the purge's interval is faked: the database and the servers run as they do.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    try {
      const started = await startReferenceApp({ db: own, authPort: 0, appPort: 0, baseUrl: 'http://127.0.0.1:9' });
      const row = (id: string, expires: string) =>
        own.query(`insert into idp_models (model, id, payload, expires_at) values ('Session', $1, '{}', ${expires})`, [
          id,
        ]);
      await row('expired', "now() - interval '1 minute'");
      await row('live', "now() + interval '1 hour'");
      const ids = async () =>
        (await own.query<{ id: string }>(`select id from idp_models where model = 'Session' order by id`)).rows.map(
          (found) => found.id,
        );
      expect(await ids()).toEqual(['expired', 'live']);
      await vi.advanceTimersByTimeAsync(600_000);
      // The pass runs on the real database: wait for it, not for a time.
      for (let turn = 0; turn < 500 && (await ids()).includes('expired'); turn++) {
        await new Promise((resolve) => setImmediate(resolve));
      }
      expect(await ids()).toEqual(['live']);
      await started.close();
      await row('expired-after-close', "now() - interval '1 minute'");
      await vi.advanceTimersByTimeAsync(600_000);
      expect(await ids()).toEqual(['expired-after-close', 'live']);
    } finally {
      vi.useRealTimers();
      await own.close();
    }
  });

  it('creates a charge with an Idempotency-Key and shows the key and whether it was replayed', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    const posted = await agent.postForm(appUrl('/charges'), {
      csrf: formField(page.body, 'csrf'),
      amount: '1250',
      currency: 'eur',
    });
    expect(posted.response.status).toBe(303);
    const charge = seen.find((request) => request.url === '/charges');
    expect(charge?.method).toBe('POST');
    expect(JSON.parse(charge!.body)).toEqual({ amount: 1250, currency: 'EUR' });
    expect(charge?.idempotencyKey).toMatch(/^"[0-9a-f-]{36}"$/);
    const after = await landing(agent, posted);
    expect(after.body).toContain(`Idempotency-Key: ${charge!.idempotencyKey!.slice(1, -1)}`);
    expect(after.body).toContain('Replayed: no');
    expect(after.body).toContain('Attempts: 1');
    // The message is shown once (post/redirect/get).
    expect((await landing(agent, posted)).body).not.toContain('Idempotency-Key:');
  });

  it('retries a failed charge with the same key, backing off 1 s then 2 s with jitter (spec part 8)', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    apiMode = 'flaky';
    failuresLeft = 2;
    const posted = await agent.postForm(appUrl('/charges'), {
      csrf: formField(page.body, 'csrf'),
      amount: '300',
      currency: 'EUR',
    });
    const attempts = seen.filter((request) => request.url === '/charges');
    expect(attempts).toHaveLength(3);
    // One key per logical operation, reused by every retry (spec 2.1: a new key per retry is wrong).
    expect(new Set(attempts.map((request) => request.idempotencyKey)).size).toBe(1);
    // Full jitter with random() = 0.5: half of the 1 s and 2 s ceilings.
    expect(waits).toEqual([500, 1000]);
    const after = await landing(agent, posted);
    expect(after.body).toContain('Attempts: 3');
    expect(after.body).toContain('Status 201');
  });

  // Spec 2.1 ("the same key is reused on every retry of that operation; a new key per retry is wrong")
  // and part 7 (a 409 is retried later with the same key). When the client's four attempts run out
  // with the outcome unknown (the gateway's 502/504, a timeout, the first attempt still running and
  // answering 409), the first attempt may have gone through: the app offers "Send the same charge
  // again (same key)", so the user's retry cannot charge twice.
  it('offers a charge whose retries ran out to be sent again with the same key (spec 2.1, part 7)', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    apiMode = 'flaky';
    failuresLeft = 100;
    const posted = await agent.postForm(appUrl('/charges'), {
      csrf: formField(page.body, 'csrf'),
      amount: '700',
      currency: 'EUR',
    });
    const attempts = seen.filter((request) => request.url === '/charges');
    expect(attempts).toHaveLength(4);
    // Spec part 8's whole ladder, 1 s then 2 s then 4 s, each with full jitter (random() = 0.5).
    expect(waits).toEqual([500, 1000, 2000]);
    const key = attempts[0]?.idempotencyKey;
    failuresLeft = 0;
    const after = await landing(agent, posted);
    expect(after.body).toContain('API unavailable');
    expect(after.body).toContain('Send the same charge again (same key)');
    seen.length = 0;
    await agent.postForm(appUrl('/charges'), {
      csrf: formField(after.body, 'csrf'),
      key: formField(after.body, 'key'),
      amount: formField(after.body, 'amount'),
      currency: formField(after.body, 'currency'),
    });
    expect(seen.filter((request) => request.url === '/charges').map((request) => request.idempotencyKey)).toEqual([
      key,
    ]);
  });

  it('offers a charge still in progress after every retry (409) to be sent again with its key (spec part 7)', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    apiMode = 'busy';
    const posted = await agent.postForm(appUrl('/charges'), {
      csrf: formField(page.body, 'csrf'),
      amount: '700',
      currency: 'EUR',
    });
    const attempts = seen.filter((request) => request.url === '/charges');
    expect(attempts).toHaveLength(4);
    // A 409 is treated like a timeout (part 7): backed off, then retried with the same key. Its
    // Retry-After (1 s) is a floor under the jittered waits (500 ms, 1 s, 2 s with random() = 0.5);
    // a wait it lengthens gets half of its spread past it (a fifth of 1 s: 100 ms).
    expect(new Set(attempts.map((request) => request.idempotencyKey)).size).toBe(1);
    expect(waits).toEqual([1100, 1000, 2000]);
    const after = await landing(agent, posted);
    expect(after.body).toContain('Still in progress at the API (409): send it again with the same key in a moment.');
    expect(formField(after.body, 'key')).toBe(attempts[0]?.idempotencyKey?.slice(1, -1));
  });

  it('offers no resend of a charge the API refused (a 4xx ran nothing, and would be refused again)', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    apiMode = 'refuse';
    const posted = await agent.postForm(appUrl('/charges'), {
      csrf: formField(page.body, 'csrf'),
      amount: '700',
      currency: 'EUR',
    });
    expect(seen.filter((request) => request.url === '/charges')).toHaveLength(1);
    const after = await landing(agent, posted);
    expect(after.body).toContain('The API refused: 422 Unprocessable Content');
    expect(after.body).not.toContain('Send the same charge again (same key)');
  });

  // The form's own key, its charge's answer lost on the way to the browser (the redirect to its
  // message never followed): the page comes back with that key and amount, and says what is known,
  // until a page has shown the charge's outcome. An unknown outcome shown keeps the key; a refusal
  // shown (nothing ran) ends it.
  it('brings back the key and amount of a charge whose outcome no page showed, saying what is known', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    const key = formField(page.body, 'key');
    const send = (body: string) =>
      agent.postForm(appUrl('/charges'), { csrf: formField(body, 'csrf'), key, amount: '700', currency: 'EUR' });
    apiMode = 'drop';
    const lost = await send(page.body);
    const back = await agent.request(appUrl('/'));
    expect(back.body).toContain('Your charge of 700 EUR was sent; it may have gone through.');
    expect(back.body).toContain('<title>Create charge: Your charge of 700 EUR was sent; it may have gone through.');
    expect(formField(back.body, 'key')).toBe(key);
    expect(back.body).toMatch(/name="amount"[^>]*value="700"/);
    // The page the charge led to says it itself; the key stays, the outcome is still unknown.
    const shown = await landing(agent, lost);
    expect(shown.body).toContain('API unavailable');
    expect(shown.body).not.toContain('it may have gone through.');
    expect((await agent.request(appUrl('/'))).body).toContain('it may have gone through.');
    apiMode = 'refuse';
    const refused = await send(shown.body);
    expect((await agent.request(appUrl('/'))).body).toContain(
      'Your charge of 700 EUR was refused: nothing was charged.',
    );
    expect((await landing(agent, refused)).body).toContain('The API refused: 422');
    const after = await agent.request(appUrl('/'));
    expect(after.body).not.toContain('Your charge of 700 EUR');
    expect(formField(after.body, 'key')).not.toBe(key);
    expect(seen.filter((request) => request.url === '/charges').map((request) => request.idempotencyKey)).toEqual(
      Array(5).fill(`"${key}"`),
    );
  });

  // Mutation audit: each kind of unknown outcome keeps the key on its own (mayHaveRun's clauses).
  it.each([
    ['a 500 on every attempt', 'crash', 4],
    ['no answer on any attempt', 'drop', 4],
    ['a success whose body does not parse', 'garbled', 1],
  ] as const)('keeps the key of a charge whose outcome is unknown after %s', async (_name, mode, tries) => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    apiMode = mode;
    const posted = await agent.postForm(appUrl('/charges'), {
      csrf: formField(page.body, 'csrf'),
      amount: '700',
      currency: 'EUR',
    });
    const attempts = seen.filter((request) => request.url === '/charges');
    expect(attempts).toHaveLength(tries);
    const after = await landing(agent, posted);
    expect(after.body).toContain('Send the same charge again (same key)');
    expect(formField(after.body, 'key')).toBe(attempts[0]?.idempotencyKey?.slice(1, -1));
  });

  // Was wrong: @idem/client resolves on any status below 400, and the app said "Charge created." for
  // a 3xx too, ending the key. A redirect is no 2xx: what came of the charge is not known.
  it('says a charge the API answered with a redirect (303) may have run, and keeps its key', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    const key = formField(page.body, 'key');
    apiMode = 'moved';
    const posted = await agent.postForm(appUrl('/charges'), {
      csrf: formField(page.body, 'csrf'),
      key,
      amount: '700',
      currency: 'EUR',
    });
    expect(seen.filter((request) => request.url === '/charges')).toHaveLength(1);
    const after = await landing(agent, posted);
    expect(after.body).not.toContain('Charge created.');
    expect(after.body).toContain('303');
    expect(after.body).toContain('Send the same charge again (same key)');
    expect(formField(after.body, 'key')).toBe(key);
    // The outcome shown is unknown: the key stays the session's open charge, not one that went through.
    const back = await agent.request(appUrl('/'));
    expect(back.body).toContain('Your charge of 700 EUR was sent; it may have gone through.');
    expect(formField(back.body, 'key')).toBe(key);
  });

  // The API's other way to say a key stands for another charge: 400 `idempotency_error` (an engine
  // with `mismatchStatus: 400`, spec part 7), answered in words as its 422 `fingerprint_mismatch` is.
  it('answers a kept key refused 400 idempotency_error in words: the first charge stands, nothing new was charged', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    const key = formField(page.body, 'key');
    const send = (amount: string) =>
      agent.postForm(appUrl('/charges'), { csrf: formField(page.body, 'csrf'), key, amount, currency: 'EUR' });
    // The first charge goes through; its answer is lost (the redirect to its message never followed).
    await send('700');
    apiMode = 'key-taken';
    const refused = await send('800');
    const after = await landing(agent, refused);
    expect(after.body).toContain('Not charged: this form had already been sent with other details.');
    expect(after.body).toContain('(400 idempotency_error)');
    expect(after.body).toContain('Your charge of 700 EUR went through: that is the first charge.');
    expect(after.body).toContain(`Idempotency-Key: ${key}`);
    expect(after.body).not.toContain('The API refused');
    expect(after.body).not.toContain('Send the same charge again (same key)');
    // The form below is a new charge, and so is the next page's.
    expect(formField(after.body, 'key')).not.toBe(key);
    expect(formField((await agent.request(appUrl('/'))).body, 'key')).not.toBe(key);
  });

  it('keeps the key of a charge refused only after an attempt whose outcome is unknown (503, then 422)', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    apiMode = 'refuse';
    failuresLeft = 1;
    const posted = await agent.postForm(appUrl('/charges'), {
      csrf: formField(page.body, 'csrf'),
      amount: '700',
      currency: 'EUR',
    });
    const attempts = seen.filter((request) => request.url === '/charges');
    expect(attempts).toHaveLength(2);
    const after = await landing(agent, posted);
    expect(after.body).toContain('The API refused: 422 Unprocessable Content');
    expect(formField(after.body, 'key')).toBe(attempts[0]?.idempotencyKey?.slice(1, -1));
  });

  // A charge can take 15 s with its retries. Meanwhile another tab of the same session refreshes and
  // rotates the refresh token; the slow request must not write the used one back with its message.
  it.each([
    ['a charge', 'POST', '/charges', '/charges', { amount: '100', currency: 'EUR' }, 'Charge created.'],
    ['a theme change', 'PUT', '/settings', '/theme', { theme: 'dark' }, 'Theme set to dark.'],
  ])(
    'keeps the refresh token a concurrent refresh rotated while %s was in flight',
    async (_name, method, apiPath, path, fields, message) => {
      const { agent } = await signIn();
      const page = await agent.request(appUrl('/'));
      const held = holdApi(method, apiPath);
      const posted = agent.postForm(appUrl(path), { csrf: formField(page.body, 'csrf'), ...fields });
      await held.reached;
      // The other tab finds the access token about to expire and refreshes.
      clock = 290_000;
      expect((await agent.request(appUrl('/'))).body).toContain('Alice Liddell');
      const rotated = (await sessions().get(sessionId(agent)))?.tokens;
      held.release();
      expect((await posted).response.status).toBe(303);
      // The message is stored, and the tokens are still the rotated ones, not the ones read at the start.
      const stored = await sessions().get(sessionId(agent));
      expect(Object.values(stored?.flashes ?? {})[0]?.lines).toContain(message);
      expect(stored?.tokens).toEqual(rotated);
      // The next refresh presents a token never used: the grant lives, the user stays signed in.
      clock = 600_000;
      const later = await landing(agent, await posted);
      expect(later.body).toContain('Alice Liddell');
      expect(later.body).toContain(message);
    },
  );

  it("uses the session's current access token for each attempt of a charge, refreshed if need be", async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    const first = (await sessions().get(sessionId(agent)))?.tokens?.accessToken;
    apiMode = 'flaky';
    failuresLeft = 1;
    // The token is about to expire by the time the retry goes.
    duringRetryWait = () => {
      clock = 290_000;
    };
    await agent.postForm(appUrl('/charges'), { csrf: formField(page.body, 'csrf'), amount: '300', currency: 'EUR' });
    const attempts = seen.filter((request) => request.url === '/charges').map((request) => request.authorization);
    const refreshed = (await sessions().get(sessionId(agent)))?.tokens?.accessToken;
    expect(refreshed).not.toBe(first);
    expect(attempts).toEqual([`Bearer ${first}`, `Bearer ${refreshed}`]);
  });

  it('switches the theme with PUT /settings', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    const posted = await agent.postForm(appUrl('/theme'), { csrf: formField(page.body, 'csrf'), theme: 'dark' });
    expect(posted.response.status).toBe(303);
    const put = seen.find((request) => request.method === 'PUT');
    expect(put?.url).toBe('/settings');
    expect(JSON.parse(put!.body)).toEqual({ theme: 'dark' });
  });

  // Was wrong: a theme the API answered 303 was shown as "The API refused: 303 HTTP 303". A redirect
  // is no refusal, and no 2xx either: whether the theme was set is not known.
  it('says a theme the API answered with a redirect (303) may or may not be set, and is safe to send again', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    apiMode = 'moved';
    const posted = await agent.postForm(appUrl('/theme'), { csrf: formField(page.body, 'csrf'), theme: 'dark' });
    expect(posted.response.status).toBe(303);
    expect(seen.filter((request) => request.method === 'PUT' && request.url === '/settings')).toHaveLength(1);
    const after = await landing(agent, posted);
    expect(after.body).not.toContain('refused');
    expect(after.body).not.toContain('Theme set to dark.');
    expect(after.body).toContain('The API answered 303');
    expect(after.body).toContain('may or may not have been set to dark');
    expect(after.body).toContain('Setting the theme again does no harm');
  });

  // Was wrong: a read the API answered 303 was shown as "The API refused: 303 HTTP 303". A redirect
  // the app does not follow is no refusal: there is only nothing to show.
  it("says the home page's reads the API answered with a redirect (303) were redirected, not refused", async () => {
    const { agent } = await signIn();
    apiMode = 'moved-reads';
    const page = await agent.request(appUrl('/'));
    expect(page.response.status).toBe(200);
    expect(page.body).not.toContain('refused');
    expect(
      page.body.match(/The API answered 303 \(a redirect the app does not follow\): nothing to show\./g)?.length,
    ).toBe(3);
  });

  it('answers a form the parser refuses with its 4xx and a plain page, not a 500', async () => {
    const { agent } = await signIn();
    const page = await agent.request(appUrl('/'));
    const csrf = encodeURIComponent(formField(page.body, 'csrf'));
    const large = await agent.request(appUrl('/signout'), {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: `csrf=${csrf}&pad=${'a'.repeat(9 * 1024)}`,
    });
    expect(large.response.status).toBe(413);
    expect(large.response.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    const klingon = await agent.request(appUrl('/charges'), {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded; charset=klingon' },
      body: `csrf=${csrf}&amount=1&currency=EUR`,
    });
    expect(klingon.response.status).toBe(415);
    expect(seen.filter((request) => request.method !== 'GET')).toEqual([]);
    // Still signed in: neither refusal touched the session.
    expect((await agent.request(appUrl('/'))).body).toContain('Alice Liddell');
  });

  it('answers a method a page does not take with 405 and Allow, and an unknown page with 404, both our pages', async () => {
    const { agent } = await signIn();
    const cases: Array<[string, string, string]> = [
      ['DELETE', '/', 'GET, HEAD, OPTIONS'],
      ['GET', '/charges', 'POST, OPTIONS'],
      ['PUT', '/signin', 'GET, HEAD, POST, OPTIONS'],
      ['GET', '/signout', 'POST, OPTIONS'],
    ];
    for (const [method, path, allow] of cases) {
      const step = await agent.request(appUrl(path), { method });
      expect(step.response.status, `${method} ${path}`).toBe(405);
      expect(step.response.headers.get('allow'), `${method} ${path}`).toBe(allow);
      expect(step.response.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
      expect(step.body).toContain('Method not allowed');
    }
    const options = await agent.request(appUrl('/charges'), { method: 'OPTIONS' });
    expect(options.response.status).toBe(204);
    expect(options.response.headers.get('allow')).toBe('POST, OPTIONS');
    const unknown = await agent.request(appUrl('/no/such/page'));
    expect(unknown.response.status).toBe(404);
    expect(unknown.response.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    expect(unknown.body).toContain('Page not found');
    expect(seen.filter((request) => request.method !== 'GET')).toEqual([]);
    expect((await agent.request(appUrl('/'))).body).toContain('Alice Liddell');
  });

  it('refuses form posts without the CSRF token', async () => {
    const { agent } = await signIn();
    for (const path of ['/charges', '/theme', '/signout']) {
      const step = await agent.postForm(appUrl(path), { amount: '1', currency: 'EUR', theme: 'dark' });
      expect(step.response.status).toBe(403);
    }
    expect(seen.filter((request) => request.method !== 'GET')).toEqual([]);
    expect((await agent.request(appUrl('/'))).body).toContain('Alice Liddell');
  });
});

describe('refresh and sign-out', () => {
  it('refreshes when the access token has expired, rotating the refresh token', async () => {
    const { agent } = await signIn();
    const before = await sessions().get(sessionId(agent));
    clock = 301_000;
    const page = await agent.request(appUrl('/'));
    expect(page.body).toContain('Alice Liddell');
    const after = await sessions().get(sessionId(agent));
    expect(after?.tokens?.accessToken).not.toBe(before?.tokens?.accessToken);
    expect(after?.tokens?.refreshToken).not.toBe(before?.tokens?.refreshToken);
    const used = seen.filter((request) => request.url === '/photos').map((request) => request.authorization);
    expect(used.at(-1)).toBe(`Bearer ${after?.tokens?.accessToken}`);
  });

  // Mutation pass: the in-flight refresh leaves the map when it ends. Kept there, the session's next
  // expiry would be answered with the first refresh's (by then expired) tokens, never refreshed again.
  it('refreshes again when the refreshed access token expires in turn', async () => {
    const { agent } = await signIn();
    clock = 301_000;
    expect((await agent.request(appUrl('/'))).body).toContain('Alice Liddell');
    const once = await sessions().get(sessionId(agent));
    clock = 602_000;
    expect((await agent.request(appUrl('/'))).body).toContain('Alice Liddell');
    const twice = await sessions().get(sessionId(agent));
    expect(twice?.tokens?.accessToken).not.toBe(once?.tokens?.accessToken);
    expect(twice?.tokens?.refreshToken).not.toBe(once?.tokens?.refreshToken);
  });

  it('refreshes once for concurrent requests of one session (no false reuse detection)', async () => {
    const { agent } = await signIn();
    clock = 301_000;
    const pages = await Promise.all([
      agent.request(appUrl('/')),
      agent.request(appUrl('/')),
      agent.request(appUrl('/')),
    ]);
    for (const page of pages) expect(page.body).toContain('Alice Liddell');
    clock = 0;
    // Had two refreshes raced, the rotated token would have been reused and the grant revoked.
    const after = await sessions().get(sessionId(agent));
    const check = await tokenRequest(
      running.authUrl,
      { grant_type: 'refresh_token', refresh_token: after!.tokens!.refreshToken! },
      running.clients.app,
    );
    expect(check.status).toBe(200);
  });

  it('ends the session when the grant was revoked at the provider', async () => {
    const { agent } = await signIn();
    const stored = await sessions().get(sessionId(agent));
    const revoked = await fetch(new URL('/token/revocation', running.authUrl), {
      method: 'POST',
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        authorization: `Basic ${Buffer.from(`${running.clients.app.clientId}:${running.clients.app.clientSecret}`).toString('base64')}`,
      },
      body: new URLSearchParams({ token: stored!.tokens!.refreshToken! }),
    });
    expect(revoked.status).toBe(200);
    clock = 301_000;
    const page = await agent.request(appUrl('/'));
    expect(page.response.status).toBe(200);
    expect(page.body).toContain('Sign in');
    expect(page.body).not.toContain('Alice Liddell');
  });

  it('revokes the tokens of the session it replaces when sign-in starts again (RFC 7009)', async () => {
    const { agent } = await signIn();
    const id = sessionId(agent);
    const stored = await sessions().get(id);
    const again = await signInAgain(agent);
    expect(again.response.status).toBe(303);
    expect(again.response.headers.get('location')).toContain(`${running.authUrl}/auth?`);
    expect(sessionId(agent)).not.toBe(id);
    expect(await sessions().get(id)).toBeUndefined();
    // The old grant is gone at the provider: its refresh token no longer works.
    const refresh = await tokenRequest(
      running.authUrl,
      { grant_type: 'refresh_token', refresh_token: stored!.tokens!.refreshToken! },
      running.clients.app,
    );
    expect(refresh.body.error).toBe('invalid_grant');
    // The JWT access token cannot be revoked (it expires in 5 minutes): that is no failure to report.
    expect(appEvents).toEqual([]);
  });

  // The app reads a session's refresh token to revoke it while a refresh of that session may be rotating
  // it. The revoked token may then be the consumed one, and the rotated one may even be stored after the
  // revocation. Neither works afterwards: oidc-provider revokes the whole grant when any of its refresh
  // tokens is revoked, consumed ones included, and refuses a token whose grant is gone.
  describe.each([
    ['sign-in starts again', '/signin', 303],
    ['the user signs out', '/signout', 303],
  ])('a refresh in flight while %s (both requests in flight)', (_action, path, status) => {
    type Statement = (text: string, params: readonly unknown[]) => boolean;
    const grantOf = async (refreshToken: string) =>
      (
        await db.query<{ grant_id: string }>(
          `select grant_id from idp_models where model = 'RefreshToken' and id = $1`,
          [storedId('RefreshToken', refreshToken)],
        )
      ).rows[0]?.grant_id;
    // Every refresh token the provider stored, by the key of its row: the rows keep only that (a hash,
    // `stored-id.ts`), and the test presents the tokens themselves.
    const saved = new Map<string, string>();
    beforeAll(() => {
      running.idp.provider.on('refresh_token.saved', (token: { jti: string }) => {
        saved.set(storedId('RefreshToken', token.jti), token.jti);
      });
    });
    const presentable = (key: string) => {
      const token = saved.get(key);
      expect(token, 'a stored refresh token the provider said it saved').toEqual(expect.any(String));
      return token!;
    };
    const storedUnder = async (model: 'RefreshToken' | 'Grant', grantId: string) =>
      (
        await db.query<{ id: string }>(
          model === 'Grant'
            ? `select id from idp_models where model = 'Grant' and id = $1`
            : `select id from idp_models where model = 'RefreshToken' and grant_id = $1`,
          [grantId],
        )
      ).rows.map((row) => row.id);

    it.each<[string, Statement, (params: readonly unknown[], id: string) => string | undefined]>([
      [
        // The rotation's save, which is one statement with its use of the old token (`adapter.ts`):
        // held there, the revocation comes first, and the rotated token is never stored.
        'stores the rotated refresh token after the revocation',
        (text, params) => /\binsert into idp_models\b/.test(text) && params[0] === 'RefreshToken',
        // The key of its row: the token itself only if it was stored (it is refused after the revocation).
        (params) => saved.get(String(params[1])),
      ],
      [
        'has rotated it, and the app has not stored the new one yet',
        // The statement that stores the refreshed tokens (not the claim on the refresh before it).
        (text, params) => text.trimStart().startsWith('update app_sessions') && String(params[1]).includes('"sealed"'),
        // Sealed with a key of the session id (sessions.ts): opened as only the app, with the cookie, can.
        (params, id) => {
          const { sealed } = JSON.parse(String(params[1])) as { sealed: unknown };
          const tokens = openTokens(id, String(params[0]), sealed);
          expect(tokens?.refreshToken, 'the rotated refresh token, opened with the cookie').toEqual(expect.any(String));
          return tokens?.refreshToken;
        },
      ],
      [
        'gets the revocation before the refresh consumes the old token',
        (text, params) => text.includes('set consumed_at') && params[0] === 'RefreshToken',
        () => undefined,
      ],
    ])('leaves no refresh token of the session working when the provider %s', async (_name, statement, rotated) => {
      const { agent } = await signIn();
      const csrf = formField((await agent.request(appUrl('/'))).body, 'csrf');
      const id = sessionId(agent)!;
      const refreshToken = (await sessions().get(id))!.tokens!.refreshToken!;
      const grantId = (await grantOf(refreshToken))!;
      expect(grantId).toEqual(expect.any(String));
      clock = 301_000;
      // The home page refreshes the expired access token. It is held at the chosen statement while the
      // other request, for the same session, reads its tokens and revokes them; then it goes on.
      const held = gate.hold(statement);
      const home = agent.request(appUrl('/'));
      const params = await held.reached;
      const ended = await agent.postForm(appUrl(path), { csrf, return_to: '/' });
      expect(ended.response.status).toBe(status);
      held.release();
      await home;
      clock = 0;
      const rotatedToken = rotated(params, id);
      const tokens = new Set([refreshToken, ...(await storedUnder('RefreshToken', grantId)).map(presentable)]);
      if (rotatedToken) tokens.add(rotatedToken);
      for (const token of tokens) {
        const which = token === rotatedToken ? 'the rotated token' : 'a token of the grant';
        const result = await tokenRequest(
          running.authUrl,
          { grant_type: 'refresh_token', refresh_token: token },
          running.clients.app,
        );
        expect(result.body.error, which).toBe('invalid_grant');
        expect(await introspect(running.authUrl, token, running.clients.app), which).toEqual({ active: false });
      }
      // The grant itself is gone, so a token stored under it afterwards is worthless too.
      expect(await storedUnder('Grant', grantId)).toEqual([]);
      expect(appEvents).toEqual([]);
    });
  });

  it('still starts the new sign-in when the old tokens cannot be revoked, and reports it', async () => {
    const events: ThirdPartyAppEvent[] = [];
    const own = await startOwnProvider((event) => events.push(event));
    try {
      const { agent, id, tokens } = await own.signIn();
      own.revocation = 'unavailable';
      const again = await signInAgain(agent, own.url);
      expect(again.response.status).toBe(303);
      expect(again.response.headers.get('location')).toContain(`${own.authUrl}/auth?`);
      expect(sessionId(agent)).not.toBe(id);
      expect(events).toContainEqual(
        expect.objectContaining({ type: 'revocation-failed', during: 'sign-in', tokenType: 'refresh_token' }),
      );
      // Nothing in an event carries a token.
      expect(serialised(events)).not.toContain(tokens.refreshToken);
    } finally {
      await own.close();
    }
  });

  // README: "A revocation that fails (the provider cannot be reached) keeps no one from signing in or out:
  // the app says so on stderr (or to its onEvent), and the token works until it expires."
  it.each([...revocationFailures, tokenEchoed])(
    'signs out all the same when the provider %s, reports it without a token, and the token still works',
    async (name, failRevocation) => {
      const events: ThirdPartyAppEvent[] = [];
      const own = await startOwnProvider((event) => events.push(event));
      try {
        const { agent, id, tokens } = await own.signIn();
        const csrf = formField((await agent.request(own.url('/'))).body, 'csrf');
        await failRevocation(own);
        const out = await agent.postForm(own.url('/signout'), { csrf });
        expect(out.response.status).toBe(200);
        expect(out.body).toContain(
          'You are signed out here; the identity provider could not be reached to revoke the tokens.',
        );
        expect(out.body).toContain('<a href="/signin">Sign in</a>');
        expect(agent.jar.cookies.has('app_session')).toBe(false);
        // The session is gone here: its cookie, sent again as it was, gets the signed-out page.
        expect(await createSessionStore(own.db, { ttlSeconds: 60 }).get(id)).toBeUndefined();
        const replayed = await fetch(own.url('/'), { headers: { cookie: `app_session=${id}` } });
        const replayedPage = await replayed.text();
        expect(replayedPage).toContain('<a href="/signin">Sign in</a>');
        expect(replayedPage).not.toContain('Alice Liddell');
        // Reported through onEvent, once for each token, the access token too: a provider that answers
        // says "unsupported_token_type" for a JWT, which is no failure, but this one did not answer ...
        expect(events).toHaveLength(2);
        for (const tokenType of ['refresh_token', 'access_token']) {
          expect(events).toContainEqual({
            type: 'revocation-failed',
            during: 'sign-out',
            tokenType,
            error: expect.anything(),
          });
        }
        // Each says what went wrong, as a plain Error ...
        for (const event of events) expect(event.error).toBeInstanceOf(Error);
        if (name === tokenEchoed[0]) {
          expect(events[0]?.error).toMatchObject({ error: 'invalid_request', status: 400 });
        } else if (name === revocationFailures[0]?.[0]) {
          expect(events[0]?.error.code).toBe('ECONNREFUSED');
        }
        // ... and no token in any of it, down to the error's message, stack, cause and hidden fields.
        const text = serialised(events);
        for (const token of [tokens.refreshToken, tokens.accessToken]) {
          expect(token).toEqual(expect.any(String));
          expect(text).not.toContain(token);
        }
        // The provider never heard of the sign-out: once back, it still honours the refresh token.
        await own.restore();
        const refresh = await tokenRequest(
          own.authUrl,
          { grant_type: 'refresh_token', refresh_token: tokens.refreshToken! },
          own.clients.app,
        );
        expect(refresh.status).toBe(200);
      } finally {
        await own.close();
      }
    },
  );

  // The default onEvent (ThirdPartyAppOptions): "one line on stderr, without the token".
  it.each([...revocationFailures, tokenEchoed])(
    'logs a revocation that failed because the provider %s on stderr by default, without any token',
    async (_name, failRevocation) => {
      const warn = vi.spyOn(console, 'warn').mockImplementation(() => undefined);
      const own = await startOwnProvider();
      try {
        const { agent, tokens } = await own.signIn();
        const csrf = formField((await agent.request(own.url('/'))).body, 'csrf');
        await failRevocation(own);
        expect((await agent.postForm(own.url('/signout'), { csrf })).response.status).toBe(200);
        const lines = warn.mock.calls.map((args) => format(...args));
        expect(lines).toHaveLength(2);
        for (const tokenType of ['refresh_token', 'access_token']) {
          expect(lines).toContainEqual(
            expect.stringContaining(`the ${tokenType} of a session ended by sign-out could not be revoked`),
          );
        }
        const secrets = [tokens.refreshToken, tokens.accessToken, own.clients.app.clientSecret];
        for (const line of lines) {
          expect(line).not.toContain('\n');
          for (const secret of secrets) expect(line).not.toContain(secret);
        }
      } finally {
        warn.mockRestore();
        await own.close();
      }
    },
  );

  it("sends the browser to the provider's logout without the ID token in the address", async () => {
    // An address is kept in the browser's history and the provider's access logs: an ID token there
    // hands the user's name and email to whoever reads them. client_id names the client instead.
    const { agent } = await signIn();
    // Nor is it kept: the session holds only the tokens the app uses.
    const kept = (await sessions().get(sessionId(agent)))?.tokens;
    expect(kept?.accessToken).toEqual(expect.any(String));
    expect(Object.keys(kept ?? {})).not.toContain('idToken');
    const page = await agent.request(appUrl('/'));
    const out = await agent.postForm(appUrl('/signout'), { csrf: formField(page.body, 'csrf') });
    expect(out.response.status).toBe(303);
    const leave = new URL(out.response.headers.get('location') ?? '');
    expect(leave.searchParams.get('client_id')).toBe(running.clients.app.clientId);
    expect(leave.searchParams.has('id_token_hint')).toBe(false);
    expect(leave.href).not.toMatch(/eyJ/);
    const confirm = await agent.request(leave.href);
    expect(confirm.body).toContain('Yes, sign me out');
  });

  it('revokes the refresh token at the provider on sign-out and clears the cookie', async () => {
    const { agent } = await signIn();
    const id = sessionId(agent);
    const stored = await sessions().get(id);
    const page = await agent.request(appUrl('/'));
    const out = await signOutOfApp(agent, running.appUrl, formField(page.body, 'csrf'));
    expect(out.response.status).toBe(200);
    expect(out.body).toContain('You are signed out.');
    expect(agent.jar.cookies.has('app_session')).toBe(false);
    const refresh = await tokenRequest(
      running.authUrl,
      { grant_type: 'refresh_token', refresh_token: stored!.tokens!.refreshToken! },
      running.clients.app,
    );
    expect(refresh.body.error).toBe('invalid_grant');
    expect(await sessions().get(id)).toBeUndefined();
  });
});

// The app keeps its sessions on the shared database: PGlite by default, PostgreSQL with DATABASE_URL.
describe.each([
  ['embedded PGlite', () => openDatabase({ memory: true })],
  ['the test database', async () => db],
])('the session store on %s', (_name, open) => {
  let own: Database;
  beforeAll(async () => {
    own = await open();
    await migrateApp(own);
  });
  afterAll(async () => {
    if (own !== db) await own?.close();
  });
  const tokens = (refreshToken: string) => ({ accessToken: `at-${refreshToken}`, refreshToken, expiresAt: 1 });

  it('changes only the fields a refresh stores, whatever the caller read before', async () => {
    const store = createSessionStore(own, { ttlSeconds: 60 });
    const id = await store.create({ user: { sub: 'user-alice' }, tokens: tokens('rt-1') });
    await writeSession(store, id, { tokens: tokens('rt-2') });
    await store.setFlash(id, 'tab-1', { title: 'Create charge', lines: ['Charge created.'] });
    await store.setFlash(id, 'tab-2', { title: 'Theme', lines: [] });
    expect(await store.get(id)).toEqual({
      user: { sub: 'user-alice' },
      tokens: tokens('rt-2'),
      flashes: {
        'tab-1': { title: 'Create charge', lines: ['Charge created.'] },
        'tab-2': { title: 'Theme', lines: [] },
      },
    });
    await writeSession(store, id, { flashes: undefined });
    expect(await store.get(id)).toEqual({ user: { sub: 'user-alice' }, tokens: tokens('rt-2') });
    await store.destroy(id);
    await store.setFlash(id, 'tab-1', { title: 'Theme', lines: [] });
    expect(await store.get(id)).toBeUndefined();
  });

  it("takes a flash slot once, and leaves everything else, other tabs' slots included", async () => {
    const store = createSessionStore(own, { ttlSeconds: 60 });
    const mine = { title: 'Theme', lines: ['Theme set to dark.'] };
    const theirs = { title: 'Create charge', lines: ['Charge created.'] };
    const id = await store.create({ tokens: tokens('rt-1'), flashes: { mine, theirs } });
    expect(await store.takeFlash(id, 'mine')).toEqual(mine);
    expect(await store.takeFlash(id, 'mine')).toBeUndefined();
    expect(await store.get(id)).toEqual({ tokens: tokens('rt-1'), flashes: { theirs } });
  });

  // The charge whose outcome no page has shown yet: one per session, the first sent. Two tabs that send
  // at once must not take it from each other, and a late answer of one charge must not settle or end
  // another that is open by then.
  it('keeps one open charge per signed-in session, the first sent, settled and ended only by its own key', async () => {
    const store = createSessionStore(own, { ttlSeconds: 60 });
    const id = await store.create({ user: { sub: 'user-alice' }, tokens: tokens('rt-1') });
    const first = { key: 'k-1', amount: 100, currency: 'EUR' };
    const [a, b] = await Promise.all([
      store.openCharge(id, first),
      store.openCharge(id, { key: 'k-2', amount: 200, currency: 'EUR' }),
    ]);
    expect(a).toEqual(b);
    const open = a?.key === 'k-1' ? first : { key: 'k-2', amount: 200, currency: 'EUR' };
    const other = open.key === 'k-1' ? 'k-2' : 'k-1';
    await store.settleCharge(id, { key: other, amount: 300, currency: 'EUR', outcome: 'created' });
    await store.closeCharge(id, other);
    expect((await store.get(id))?.openCharge).toEqual(open);
    await store.settleCharge(id, { ...open, amount: 400, outcome: 'created' });
    expect((await store.get(id))?.openCharge).toEqual({ ...open, amount: 400, outcome: 'created' });
    await store.closeCharge(id, open.key);
    expect((await store.get(id))?.openCharge).toBeUndefined();
    expect(await store.openCharge(id, first)).toEqual(first);
    // A sign-in in progress holds none.
    const pending = await store.create({ pending: [] }, 60);
    expect(await store.openCharge(pending, first)).toBeUndefined();
    expect(await store.get(pending)).toEqual({ pending: [] });
  });

  it('keeps one sign-in transaction per state, each taken once by its own callback, the newest five', async () => {
    const store = createSessionStore(own, { ttlSeconds: 600 });
    const signIn = (state: string) => ({ state, nonce: `n-${state}`, codeVerifier: `v-${state}`, returnTo: '/' });
    const id = await store.create({ pending: [signIn('s1')] }, 60);
    expect(await store.addPending(id, signIn('s2'))).toBe(true);
    expect(await store.takePending(id, 's1')).toEqual(signIn('s1'));
    // Single use: a replayed callback, or two at once, get it once.
    const twice = await Promise.all([store.takePending(id, 's2'), store.takePending(id, 's2')]);
    expect(twice.filter(Boolean)).toEqual([signIn('s2')]);
    expect(await store.takePending(id, 's1')).toBeUndefined();
    for (const state of ['a', 'b', 'c', 'd', 'e', 'f']) expect(await store.addPending(id, signIn(state))).toBe(true);
    // Kept by the hash of their state (sessions.ts), in order.
    expect((await store.get(id))?.pending?.map((entry) => entry.stateHash)).toEqual(
      ['b', 'c', 'd', 'e', 'f'].map((state) => hashOf(state)),
    );
    // A signed-in session takes none: a new sign-in there starts a new session.
    const signedIn = await store.create({ user: { sub: 'user-alice' } });
    expect(await store.addPending(signedIn, signIn('x'))).toBe(false);
    expect(await store.takePending(undefined, 'b')).toBeUndefined();
  });

  const hashOf = (id: string) => createHash('sha256').update(id).digest('base64url');
  const secondsLeft = async (id: string) =>
    (
      await own.query<{ left: number }>(
        'select extract(epoch from expires_at - now())::float8 as left from app_sessions where id_hash = $1',
        [hashOf(id)],
      )
    ).rows[0]?.left;
  const age = (id: string) =>
    own.query(`update app_sessions set expires_at = now() - interval '1 second' where id_hash = $1`, [hashOf(id)]);

  it('issues ids of 256 random bits, base64url', async () => {
    const store = createSessionStore(own, { ttlSeconds: 60 });
    const ids = [await store.create({}), await store.create({})];
    for (const id of ids) expect(id).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(ids[0]).not.toBe(ids[1]);
  });

  it('extends a session it updates to the full TTL, so a signed-in session in use stays alive', async () => {
    const store = createSessionStore(own, { ttlSeconds: 600 });
    const id = await store.create({ user: { sub: 'user-alice' } }, 5);
    expect(await secondsLeft(id)).toBeLessThanOrEqual(5);
    await store.setFlash(id, 'slot', { title: 'Theme', lines: [] });
    expect(await secondsLeft(id)).toBeGreaterThan(590);
  });

  it('updates only a signed-in session: a pending sign-in keeps its data and its short life', async () => {
    const store = createSessionStore(own, { ttlSeconds: 600 });
    const pending = [{ state: 's', nonce: 'n', codeVerifier: 'v', returnTo: '/' }];
    const id = await store.create({ pending }, 5);
    await writeSession(store, id, { tokens: tokens('rt-1') });
    await store.setFlash(id, 'slot', { title: 'Theme', lines: [] });
    expect(await secondsLeft(id)).toBeLessThanOrEqual(5);
    expect(await store.get(id)).toEqual({
      pending: pending.map(({ state, ...rest }) => ({ stateHash: hashOf(state), ...rest })),
    });
  });

  it('never brings an expired session back: a refresh stored and takeFlash leave it expired and unseen', async () => {
    const store = createSessionStore(own, { ttlSeconds: 600 });
    const id = await store.create({ user: { sub: 'user-alice' }, flashes: { slot: { title: 'Theme', lines: [] } } });
    await age(id);
    await writeSession(store, id, { tokens: tokens('rt-late') });
    await store.setFlash(id, 'other', { title: 'Theme', lines: [] });
    expect(await secondsLeft(id)).toBeLessThan(0);
    expect(await store.get(id)).toBeUndefined();
    expect(await store.takeFlash(id, 'slot')).toBeUndefined();
  });

  // Was wrong: no session had a lifetime, only an idle timeout that every use reset (see the 12-hour
  // test above). The lifetime counts from the creation, which only the server holds.
  it('ends a session its lifetime after its creation: no use extends it past that, and then it is gone', async () => {
    const store = createSessionStore(own, { ttlSeconds: 600, lifetimeSeconds: 3600 });
    const id = await store.create({ user: { sub: 'user-alice' } });
    const born = (ago: string) =>
      own.query(`update app_sessions set created_at = now() - $2::interval where id_hash = $1`, [hashOf(id), ago]);
    await born('3550 seconds');
    await store.setFlash(id, 'slot', { title: 'Theme', lines: [] });
    expect(await secondsLeft(id)).toBeLessThanOrEqual(50);
    await writeSession(store, id, { tokens: tokens('rt-2') });
    expect(await secondsLeft(id)).toBeLessThanOrEqual(50);
    expect(await store.takeFlash(id, 'slot')).toBeDefined();
    // Past its lifetime, whatever its idle expiry says: unseen, as an expired one, and not brought back.
    await born('3601 seconds');
    await own.query(`update app_sessions set expires_at = now() + interval '1 hour' where id_hash = $1`, [hashOf(id)]);
    expect(await store.get(id)).toBeUndefined();
    await writeSession(store, id, { tokens: tokens('rt-3') });
    expect(await store.get(id)).toBeUndefined();
    expect(await store.openCharge(id, { key: 'k', amount: 1, currency: 'EUR' })).toBeUndefined();
    expect(await store.takePending(id, 's')).toBeUndefined();
    // A lifetime shorter than the idle timeout, or none at all, is refused.
    expect(() => createSessionStore(own, { ttlSeconds: 600, lifetimeSeconds: 599 })).toThrow(TypeError);
  });

  it('deletes more expired rows per create than it adds, so abandoned sign-ins cannot pile up', async () => {
    const store = createSessionStore(own, { ttlSeconds: 60 });
    const stale = [await store.create({}), await store.create({}), await store.create({})];
    for (const id of stale) await age(id);
    await store.create({});
    const { rows } = await own.query<{ id_hash: string }>('select id_hash from app_sessions where expires_at <= now()');
    for (const id of stale) expect(rows.map((row) => row.id_hash)).not.toContain(hashOf(id));
  });

  it('deletes expired rows when it creates one', async () => {
    const store = createSessionStore(own, { ttlSeconds: 60 });
    const stale = await store.create({});
    await own.query(`update app_sessions set expires_at = now() - interval '1 second' where id_hash = $1`, [
      createHash('sha256').update(stale).digest('base64url'),
    ]);
    const fresh = await store.create({}, 5);
    const { rows } = await own.query<{ id_hash: string }>('select id_hash from app_sessions');
    const hashes = rows.map((row) => row.id_hash);
    expect(hashes).not.toContain(createHash('sha256').update(stale).digest('base64url'));
    expect(hashes).toContain(createHash('sha256').update(fresh).digest('base64url'));
  });
});
