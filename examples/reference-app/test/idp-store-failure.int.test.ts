// The identity provider's own pages (sign-in, consent) and endpoints (token, authorization) while
// its database fails. DESIGN.md's HTTP
// table: a store that failed is a 503 with Retry-After, never a 500; these are a browser's pages, so
// an HTML page that says to try again. The sign-in is not lost: the same page, and the same form,
// work once the database is back. A bug is still a 500.
//
// The fault is the database's own: while `fault` is 'down', every statement of the provider is
// replaced by one the database refuses with the error of a connection terminated by the server
// (57P01), on PGlite and PostgreSQL.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { databases, dbFaults } from './db-faults.js';
import { alice } from './test-idp.js';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { createUserAgent, formAction, formField } from './user-agent.js';

describe.each(databases)("the provider's sign-in pages while its database fails, on %s", (_name, embedded) => {
  let stack: TwoAppStack;
  const faults = dbFaults();

  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'idp_store',
      embedded,
      wrapIdpDb: faults.wrap,
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
  });

  const during = faults.during;

  /** A browser at the provider's sign-in page, started from the app's "Sign in". */
  const atLoginPage = async () => {
    const agent = createUserAgent();
    const callback = new URL('/callback', stack.appUrls[0]).href;
    const page = await agent.follow(new URL('/signin', stack.appUrls[0]).href, (url) => url.startsWith(callback));
    expect(page.body).toContain('<h1>Sign in</h1>');
    return { agent, page, action: new URL(formAction(page.body, 'login'), stack.authUrl).href };
  };

  const expectUnavailablePage = (answer: { response: Response; body: string }) => {
    expect(answer.response.status).toBe(503);
    expect(answer.response.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(answer.response.headers.get('content-type')).toMatch(/^text\/html/);
    expect(answer.body).toContain('Try again in a moment');
  };

  it('answers the sign-in page and its form 503 with Retry-After, and both work once the database is back', async () => {
    const { agent, page, action } = await atLoginPage();
    expectUnavailablePage(await during('down', () => agent.request(page.url)));
    const login = { csrf: formField(page.body, 'csrf'), username: alice.username, password: alice.password };
    expectUnavailablePage(await during('down', () => agent.postForm(action, login)));

    expect((await agent.request(page.url)).response.status).toBe(200);
    expect((await agent.postForm(action, login)).response.status).toBe(303);
  });

  // The provider's own endpoints: oidc-provider's handler answered 500 server_error; now 503 with
  // Retry-After, the JSON error temporarily_unavailable.
  it('answers the token endpoint 503 with Retry-After (a refresh)', async () => {
    const { tokens } = await stack.signIn();
    const basic = Buffer.from(
      `${encodeURIComponent(stack.client.clientId)}:${encodeURIComponent(stack.client.clientSecret)}`,
    ).toString('base64');
    const answer = await during('down', () =>
      fetch(new URL('/token', stack.authUrl), {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Basic ${basic}` },
        body: new URLSearchParams({ grant_type: 'refresh_token', refresh_token: tokens.refreshToken! }),
      }),
    );
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(await answer.json()).toMatchObject({ error: 'temporarily_unavailable' });
  });

  it('still answers the token endpoint 500 server_error for a bug', async () => {
    const { tokens } = await stack.signIn();
    const basic = Buffer.from(
      `${encodeURIComponent(stack.client.clientId)}:${encodeURIComponent(stack.client.clientSecret)}`,
    ).toString('base64');
    const answer = await during('bug', () =>
      fetch(new URL('/token', stack.authUrl), {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Basic ${basic}` },
        body: new URLSearchParams({ grant_type: 'refresh_token', refresh_token: tokens.refreshToken! }),
      }),
    );
    expect(answer.status).toBe(500);
    expect(answer.headers.get('retry-after')).toBeNull();
    expect(await answer.json()).toMatchObject({ error: 'server_error' });
  });

  it('answers the authorization endpoint 503 with Retry-After', async () => {
    const start = await fetch(new URL('/signin', stack.appUrls[0]).href, { redirect: 'manual' });
    const authorize = start.headers.get('location')!;
    expect(authorize.startsWith(stack.authUrl)).toBe(true);
    const answer = await during('down', () => fetch(authorize, { redirect: 'manual' }));
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
  });

  it('still answers 500 for a bug', async () => {
    const { agent, page } = await atLoginPage();
    const answer = await during('bug', () => agent.request(page.url));
    expect(answer.response.status).toBe(500);
    expect(answer.response.headers.get('retry-after')).toBeNull();
  });
});
