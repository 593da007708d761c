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
import { consentItems, loginAndConsent } from './flow.js';
import { grantScope, narrowGrant } from './grants.js';
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

  /**
   * A browser that signed in at the provider and allowed the app (its callback not visited, so "Sign
   * in" again goes straight back to the provider, whose session skips the password), with the one
   * grant that consent made.
   */
  const firstGrant = async () => {
    const agent = createUserAgent();
    const ids = async () =>
      (await stack.dbs.one.query<{ id: string }>("select id from idp_models where model = 'Grant'")).rows.map(
        (row) => row.id,
      );
    const earlier = new Set(await ids());
    await loginAndConsent(
      agent,
      stack.authUrl,
      new URL('/signin', stack.appUrls[0]).href,
      new URL('/callback', stack.appUrls[0]).href,
      alice,
    );
    const made = (await ids()).filter((grant) => !earlier.has(grant));
    expect(made).toHaveLength(1);
    return { agent, id: made[0]! };
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

  /** A browser at the provider's consent page, signed in there as alice. */
  const atConsentPage = async () => {
    const { agent, page, action } = await atLoginPage();
    const login = await agent.postForm(action, {
      csrf: formField(page.body, 'csrf'),
      username: alice.username,
      password: alice.password,
    });
    expect(login.response.status).toBe(303);
    const consent = await agent.follow(new URL(login.response.headers.get('location')!, stack.authUrl).href);
    expect(consent.body).toContain('<h1>Allow access</h1>');
    return {
      agent,
      csrf: formField(consent.body, 'csrf'),
      action: new URL(formAction(consent.body, 'consent'), stack.authUrl).href,
    };
  };

  const grants = async () =>
    Number(
      (
        await stack.dbs.one.query<{ count: number }>(
          "select count(*)::int as count from idp_models where model = 'Grant'",
        )
      ).rows[0]?.count,
    );

  /**
   * For `during`'s `which`: every statement after the consent's grant was inserted fails (`only`
   * narrows them), the grant's own insert goes through. `saved()` says whether it came.
   */
  const afterGrantInsert = (only: (params: readonly unknown[]) => boolean = () => true) => {
    let saved = false;
    return {
      saved: () => saved,
      which: (text: string, params: readonly unknown[]) => {
        if (saved) return only(params);
        if (params[0] === 'Grant' && text.includes('insert into idp_models')) saved = true;
        return false;
      },
    };
  };

  // The consent saves its grant, then finishes the interaction: a database that fails between the two
  // must not leave the page saying "nothing was done" over a grant that was saved.
  it('takes the grant back when the database fails after the consent saved it, and says nothing was done', async () => {
    const { agent, csrf, action } = await atConsentPage();
    const before = await grants();
    // Only the interaction's statements fail (a blip): the grant's delete goes through.
    const fault = afterGrantInsert((params) => params[0] === 'Interaction');
    const answer = await during('down', () => agent.postForm(action, { csrf }), fault.which);
    expect(fault.saved()).toBe(true);
    expectUnavailablePage(answer);
    expect(answer.body).toContain('nothing was done');
    expect(await grants()).toBe(before);

    // The same form sent again goes through.
    const again = await agent.postForm(action, { csrf });
    expect(again.response.status).toBe(303);
    expect(await grants()).toBe(before + 1);
  });

  it('puts an existing grant back as it was when the database fails after the consent widened it', async () => {
    const { agent, id } = await firstGrant();
    const scopeOf = () => grantScope(stack.dbs.one, id);
    // The grant as if alice had never allowed `email`: the next consent adds it to this grant.
    const narrow = await narrowGrant(stack.dbs.one, id, 'email');
    const consent = await agent.follow(new URL('/signin', stack.appUrls[0]).href, (url) =>
      url.startsWith(new URL('/callback', stack.appUrls[0]).href),
    );
    expect(consent.body).toContain('<h1>Allow access</h1>');
    const csrf = formField(consent.body, 'csrf');
    const action = new URL(formAction(consent.body, 'consent'), stack.authUrl).href;

    const fault = afterGrantInsert((params) => params[0] === 'Interaction');
    const answer = await during('down', () => agent.postForm(action, { csrf }), fault.which);
    expect(fault.saved()).toBe(true);
    expectUnavailablePage(answer);
    expect(answer.body).toContain('nothing was done');
    expect(await scopeOf()).toBe(narrow);

    expect((await agent.postForm(action, { csrf })).response.status).toBe(303);
    expect((await scopeOf())?.split(' ')).toContain('email');
  });

  it('says the consent may have been kept, not that nothing was done, when the grant cannot be taken back', async () => {
    const { agent, csrf, action } = await atConsentPage();
    const before = await grants();
    // Every statement after the grant's insert fails, its delete too.
    const fault = afterGrantInsert();
    const answer = await during('down', () => agent.postForm(action, { csrf }), fault.which);
    expect(fault.saved()).toBe(true);
    expectUnavailablePage(answer);
    expect(await grants()).toBe(before + 1);
    expect(answer.body).not.toContain('nothing was done');
    expect(answer.body).toContain('may have been kept');
    expect(answer.body).toContain('no application');

    const again = await agent.postForm(action, { csrf });
    expect(again.response.status).toBe(303);
  });

  /** The page the app's "Sign in" leads `agent` to at the provider now (its session there skips the password). */
  const nextSignIn = (agent: ReturnType<typeof createUserAgent>) =>
    agent.follow(new URL('/signin', stack.appUrls[0]).href, (url) =>
      url.startsWith(new URL('/callback', stack.appUrls[0]).href),
    );

  // Checked, no defect: a new grant that could not be taken back (the 503 page says it may have been
  // kept) lives until its 14-day expiry, but nothing names it: the provider's session names a grant
  // only once a sign-in is resumed with it, and a new sign-in loads only that one. So the next
  // sign-in asks for consent again, and the kept grant gives nothing.
  it('asks for consent again at the next sign-in when a new grant was kept because it could not be taken back', async () => {
    const { agent, csrf, action } = await atConsentPage();
    const fault = afterGrantInsert();
    const answer = await during('down', () => agent.postForm(action, { csrf }), fault.which);
    expect(answer.body).toContain('may have been kept');
    const next = await nextSignIn(agent);
    expect(next.body).toContain('<h1>Allow access</h1>');
  });

  // Was wrong: a re-consent that widened the person's grant (here: `email` added), whose sign-in could
  // not finish and whose widening could not be put back (the database failed throughout), left the
  // grant widened; it is the grant the provider's session names, so the next sign-in's consent page,
  // which listed only what that grant lacked, said nothing about `email`, and its Allow handed it out.
  // Decided: the consent page lists every scope the request asks for, those the grant holds already
  // marked as allowed before: the kept widening is named again, and the person sees it before Allow.
  it('names the widened scope again at the next sign-in when a widened grant could not be put back', async () => {
    const { agent, id } = await firstGrant();
    await narrowGrant(stack.dbs.one, id, 'email');
    const consent = await nextSignIn(agent);
    expect(consent.body).toContain('<h1>Allow access</h1>');
    const fault = afterGrantInsert();
    const answer = await during(
      'down',
      () =>
        agent.postForm(new URL(formAction(consent.body, 'consent'), stack.authUrl).href, {
          csrf: formField(consent.body, 'csrf'),
        }),
      fault.which,
    );
    expect(answer.body).toContain('may have been kept');
    expect((await grantScope(stack.dbs.one, id))?.split(' ')).toContain('email');
    const next = await nextSignIn(agent);
    // The app asks `prompt=consent` (offline_access), so the page comes; it names `email`, which the
    // kept widening holds (so it is marked as allowed before).
    expect(next.body).toContain('<h1>Allow access</h1>');
    expect(next.body).toContain('See your email address');
    expect(consentItems(next.body)).toContainEqual({ scope: 'email', allowedBefore: true });
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
