// The third-party app while its database fails, on every route family besides sign-out (see
// signout-store-failure.int.test.ts): the page, the forms (theme, charge), "Sign in" and the OAuth
// callback. DESIGN.md's HTTP table: a store that failed is a 503 with Retry-After, never a 500; for
// the browser, an HTML page that says what happened. A form that met it did nothing: the API was not
// called, and the session and its cookie are kept, so the same form sent again works. A bug of the
// app (a TypeError) is still a 500: only the database's unavailability becomes a 503.
//
// The fault is the database's own: while `fault` is 'down', every statement of the first process is
// replaced by one the database refuses with the error of a connection terminated by the server (57P01),
// on PGlite and PostgreSQL. The provider keeps its own, working, handle.
import type { RequestListener } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { databases, terminated } from './db-faults.js';
import { introspect, loginAndConsent } from './flow.js';
import { alice } from './test-idp.js';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { createUserAgent, formField } from './user-agent.js';

describe.each(databases)('the app while its database fails, on %s', (_name, embedded) => {
  let stack: TwoAppStack;
  /** 'down': the first process's statements fail as on a terminated connection; 'bug': as a bug would. */
  let fault: 'none' | 'down' | 'flash-down' | 'create-down' | 'read-down' | 'bug' = 'none';
  /** For 'read-down': how many reads of a session (sessions.ts, `get`) still go through before they fail. */
  let readsLeft = 0;
  /** The refresh tokens the provider's token endpoint issued, in order: the app may keep none of them. */
  const issued: string[] = [];

  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'app_store',
      embedded,
      sharedApi: true,
      // Reads the token endpoint's answers on their way out: a token the app never stored is seen here.
      authMiddleware:
        (provider): RequestListener =>
        (req, res) => {
          if (req.method === 'POST' && req.url === '/token') {
            const end = res.end.bind(res) as (...args: unknown[]) => typeof res;
            res.end = ((...args: unknown[]) => {
              const [chunk] = args;
              if (typeof chunk === 'string' || Buffer.isBuffer(chunk)) {
                const token = (JSON.parse(String(chunk)) as { refresh_token?: unknown }).refresh_token;
                if (typeof token === 'string') issued.push(token);
              }
              return end(...args);
            }) as typeof res.end;
          }
          provider(req, res);
        },
      wrapDb: (db, i): Database =>
        i === 1
          ? db
          : {
              ...db,
              query: <Row>(text: string, params: readonly unknown[] = []) => {
                if (fault === 'down') return db.query<Row>(terminated);
                // Only the statement that keeps a form's outcome for the page (sessions.ts, `setFlash`).
                if (fault === 'flash-down' && text.includes("'{flashes}'")) return db.query<Row>(terminated);
                // Only the statement that stores a new session (sessions.ts, `create`).
                if (fault === 'create-down' && text.includes('insert into app_sessions'))
                  return db.query<Row>(terminated);
                // The reads of a session after the first `readsLeft` (sessions.ts, `get`).
                if (fault === 'read-down' && text.includes('with seen as') && readsLeft-- <= 0)
                  return db.query<Row>(terminated);
                if (fault === 'bug') return Promise.reject(new TypeError('Cannot read properties of undefined'));
                return db.query<Row>(text, params);
              },
            },
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
  });

  /** Runs `request` with the fault on, and turns it off whatever happens. */
  const during = async <T>(
    kind: 'down' | 'flash-down' | 'create-down' | 'read-down' | 'bug',
    request: () => Promise<T>,
  ): Promise<T> => {
    fault = kind;
    try {
      return await request();
    } finally {
      fault = 'none';
    }
  };

  const expectUnavailablePage = async (answer: Response, says: string) => {
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(answer.headers.get('content-type')).toMatch(/^text\/html/);
    expect(answer.headers.get('cache-control')).toBe('no-store');
    // The session cookie is neither cleared nor replaced: the session is there, and the next try uses it.
    expect(answer.headers.getSetCookie().filter((line) => line.startsWith('app_session='))).toEqual([]);
    expect(await answer.text()).toContain(says);
  };

  const post = (path: string, cookie: string, fields: Record<string, string>) =>
    fetch(new URL(path, stack.appUrls[0]).href, {
      method: 'POST',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams(fields),
      redirect: 'manual',
    });

  it('answers the page 503 with Retry-After, and the page again once the database is back', async () => {
    const { cookie } = await stack.signIn();
    const answer = await during('down', () =>
      fetch(new URL('/', stack.appUrls[0]).href, { headers: { cookie }, redirect: 'manual' }),
    );
    await expectUnavailablePage(answer, 'could not reach its database');
    expect((await stack.page(0, cookie)).status).toBe(200);
  });

  it('answers the theme and charge forms 503, calls no API, keeps the session, and the same forms work again', async () => {
    const { id, tokens, agent } = await stack.signIn();
    const page = await agent.request(new URL('/', stack.appUrls[0]).href);
    // The page issues the CSRF cookie its forms' token is checked against.
    const cookie = agent.jar.header();
    const csrf = formField(page.body, 'csrf');
    const key = formField(page.body, 'key');
    const charge = { csrf, key, amount: '1000', currency: 'EUR' };
    const sent = stack.sentTokens[0].length;

    const theme = await during('down', () => post('/theme', cookie, { csrf, theme: 'dark' }));
    await expectUnavailablePage(theme, 'Nothing was done');
    const charged = await during('down', () => post('/charges', cookie, charge));
    await expectUnavailablePage(charged, 'Nothing was done');
    expect(stack.sentTokens[0].length).toBe(sent);
    expect((await stack.sessions().get(id))?.tokens).toEqual(tokens);

    expect((await post('/theme', cookie, { csrf, theme: 'dark' })).status).toBe(303);
    expect((await post('/charges', cookie, charge)).status).toBe(303);
    expect(stack.sentTokens[0].length).toBeGreaterThan(sent);
  });

  // Was generic ("check before sending it again"): the theme is a PUT /settings that replaces the
  // whole document, so the same form sent again is safe, and the page offers it.
  it('says the theme may or may not have been set, and offers the same form again, when the database fails after the API was called', async () => {
    const { agent } = await stack.signIn();
    const page = await agent.request(new URL('/', stack.appUrls[0]).href);
    const cookie = agent.jar.header();
    const sent = stack.sentTokens[0].length;
    const answer = await during('flash-down', () =>
      post('/theme', cookie, { csrf: formField(page.body, 'csrf'), theme: 'dark' }),
    );
    expect(stack.sentTokens[0].length).toBe(sent + 1);
    const body = await answer.clone().text();
    await expectUnavailablePage(answer, 'Outcome not known');
    expect(body).toContain('may or may not have been set to dark');
    expect(body).not.toContain('nothing was done');
    expect(body).toContain('action="/theme"');
    expect(formField(body, 'theme')).toBe('dark');

    // Sent again once the database is back: the theme is set, and said so.
    const again = await post('/theme', cookie, { csrf: formField(body, 'csrf'), theme: formField(body, 'theme') });
    expect(again.status).toBe(303);
    expect(stack.sentTokens[0].length).toBe(sent + 2);
    const shown = await fetch(new URL(again.headers.get('location') ?? '', stack.appUrls[0]).href, {
      headers: { cookie },
      redirect: 'manual',
    });
    expect(await shown.text()).toContain('Theme set to dark.');
  });

  it('answers "Sign in" and the callback 503, and the next sign-in goes through', async () => {
    const signin = await during('down', () => fetch(new URL('/signin', stack.appUrls[0]).href, { redirect: 'manual' }));
    await expectUnavailablePage(signin, 'could not reach its database');

    const agent = createUserAgent();
    const callback = await loginAndConsent(
      agent,
      stack.authUrl,
      new URL('/signin', stack.appUrls[0]).href,
      new URL('/callback', stack.appUrls[0]).href,
      alice,
    );
    const answer = await during('down', () => agent.request(callback.href));
    expect(answer.response.status).toBe(503);
    expect(answer.response.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(answer.response.headers.get('content-type')).toMatch(/^text\/html/);
    expect(answer.body).toContain('Not signed in');

    const again = await loginAndConsent(
      agent,
      stack.authUrl,
      new URL('/signin', stack.appUrls[0]).href,
      new URL('/callback', stack.appUrls[0]).href,
      alice,
    );
    expect((await agent.request(again.href)).response.status).toBe(303);
    expect((await agent.request(new URL('/', stack.appUrls[0]).href)).body).toContain('Create charge');
  });

  it('revokes the tokens a callback got but could not store, and the next sign-in goes through', async () => {
    const agent = createUserAgent();
    const callback = await loginAndConsent(
      agent,
      stack.authUrl,
      new URL('/signin', stack.appUrls[0]).href,
      new URL('/callback', stack.appUrls[0]).href,
      alice,
    );
    const before = issued.length;
    // The code is exchanged; only the statement that stores the new session fails.
    const answer = await during('create-down', () => agent.request(callback.href));
    expect(answer.response.status).toBe(503);
    expect(answer.body).toContain('Not signed in');
    expect(issued.length).toBe(before + 1);
    // Nobody holds them now: left alive, they would work at the provider for 12 hours.
    expect(await introspect(stack.authUrl, issued.at(-1)!, stack.client)).toMatchObject({ active: false });

    // The revoked grant does not keep the same browser out: "Sign in" again goes through.
    const again = await loginAndConsent(
      agent,
      stack.authUrl,
      new URL('/signin', stack.appUrls[0]).href,
      new URL('/callback', stack.appUrls[0]).href,
      alice,
    );
    expect((await agent.request(again.href)).response.status).toBe(303);
    expect((await agent.request(new URL('/', stack.appUrls[0]).href)).body).toContain('Create charge');
    const id = agent.jar.cookies.get('app_session')?.value ?? '';
    const stored = (await stack.sessions().get(id))?.tokens?.refreshToken;
    expect(stored).toBe(issued.at(-1));
    expect(await introspect(stack.authUrl, stored!, stack.client)).toMatchObject({ active: true });
  });

  it('says "Sign in again" signed the person out, not that nothing was done, when the database fails after the old session ended', async () => {
    const { id, agent } = await stack.signIn();
    const again = await agent.request(new URL('/signin', stack.appUrls[0]).href);
    const cookie = agent.jar.header();
    const answer = await during('create-down', () =>
      post('/signin', cookie, { csrf: formField(again.body, 'csrf'), return_to: '/' }),
    );
    // The old session ended (its tokens revoked) before the new one could be stored: signed out.
    expect(await stack.sessions().get(id)).toBeUndefined();
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    const body = await answer.text();
    expect(body).not.toContain('nothing was done');
    expect(body).toContain('You are signed out');
  });

  // Was wrong: the page took (deleted) the form's one-shot message before its later reads of the
  // session; a database that failed at one of those answered 503, and the message, never seen, was gone.
  it("keeps a form's message for the page when the database fails before that page is shown", async () => {
    const { agent } = await stack.signIn();
    const page = await agent.request(new URL('/', stack.appUrls[0]).href);
    const cookie = agent.jar.header();
    const sent = await post('/theme', cookie, { csrf: formField(page.body, 'csrf'), theme: 'dark' });
    expect(sent.status).toBe(303);
    const shown = new URL(sent.headers.get('location') ?? '', stack.appUrls[0]).href;
    const open = () => fetch(shown, { headers: { cookie }, redirect: 'manual' });
    // The page's own read of the session goes through; its later read of the session (the open charge) fails.
    readsLeft = 1;
    await expectUnavailablePage(await during('read-down', open), 'could not reach its database');
    // Back: the message is there, once.
    const again = await open();
    expect(again.status).toBe(200);
    expect(await again.text()).toContain('Theme set to dark.');
    expect(await (await open()).text()).not.toContain('Theme set to dark.');
  });

  it('answers a charge whose token the database fails to read 503 (nothing was done), not "API unavailable"', async () => {
    const { agent } = await stack.signIn();
    const page = await agent.request(new URL('/', stack.appUrls[0]).href);
    const cookie = agent.jar.header();
    const sent = stack.sentTokens[0].length;
    // The form's own read of the session goes through; the charge's read of its token (getToken) fails.
    readsLeft = 1;
    const answer = await during('read-down', () =>
      post('/charges', cookie, {
        csrf: formField(page.body, 'csrf'),
        key: formField(page.body, 'key'),
        amount: '1000',
        currency: 'EUR',
      }),
    );
    expect(stack.sentTokens[0].length).toBe(sent);
    await expectUnavailablePage(answer, 'Nothing was done');
  });

  it('still answers 500 for a bug of the app, not 503', async () => {
    const { cookie } = await stack.signIn();
    const answer = await during('bug', () =>
      fetch(new URL('/', stack.appUrls[0]).href, { headers: { cookie }, redirect: 'manual' }),
    );
    expect(answer.status).toBe(500);
    expect(answer.headers.get('retry-after')).toBeNull();
  });
});
