import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { type Browser, type BrowserContext, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openTokens, sealTokens } from '../src/app/sealed-tokens.js';
import { listen } from '../src/listen.js';
import { demoUsers } from '../src/seed.js';
import { chromiumOptions, hasChromium } from './chromium.js';
import { startWholeStack, type WholeStack } from './test-stack.js';

const alice = demoUsers.find((user) => user.username === 'alice');

/** A promise and the function that settles it. */
function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

describe.runIf(hasChromium)('the reference app in a real browser: what a person does', () => {
  let whole: WholeStack;
  let browser: Browser;
  /** Every page error and every console message that is not a plain failed status, for the last test. */
  const problems: string[] = [];

  beforeAll(async () => {
    whole = await startWholeStack('browser_audit');
    browser = await chromium.launch(chromiumOptions);
  }, 120_000);

  afterAll(async () => {
    await browser?.close();
    await whole?.close();
  });

  async function newPage(context: BrowserContext): Promise<Page> {
    const page = await context.newPage();
    page.on('pageerror', (error) => problems.push(`pageerror at ${page.url()}: ${error.message}`));
    page.on('console', (message) => {
      if (message.type() !== 'error' && message.type() !== 'warning') return;
      // A 4xx/5xx page the story expects (403, 400, the favicon's 404) is logged like this; it is no problem.
      if (/^Failed to load resource: the server responded with a status of \d{3}/.test(message.text())) return;
      problems.push(`console ${message.type()} at ${page.url()}: ${message.text()}`);
    });
    return page;
  }

  /** Opens the app in a new tab of `context` and signs in as alice (login, Allow). */
  async function signIn(context: BrowserContext): Promise<Page> {
    const page = await newPage(context);
    await page.goto(whole.running.appUrl);
    await page.getByRole('link', { name: 'Sign in' }).click();
    await page.getByLabel('Username').fill('alice');
    await page.getByLabel('Password').fill(alice?.password ?? '');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Allow access' }).waitFor();
    await page.getByRole('button', { name: 'Allow' }).click();
    await page.waitForURL((url) => url.href.startsWith(whole.running.appUrl));
    await page.locator('#user-name').waitFor();
    return page;
  }

  /** Clicks the middle of `box` as a mouse does, even while the page waits for the next one. */
  async function clickAgain(page: Page, box: { x: number; y: number; width: number; height: number }) {
    await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
  }

  const charges = async (amount: number) =>
    (await whole.db.query<{ n: number }>('select count(*)::int as n from api_charges where amount = $1', [amount]))
      .rows[0]?.n;

  const flash = (page: Page) => page.locator('section[aria-labelledby="flash"]');

  it('pins: Back after sign-out shows no private data (every page is no-store) and the form is gone', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    expect(await page.locator('main').textContent()).toContain('Tea party');
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByRole('button', { name: 'Yes, sign me out' }).click();
    await page.getByText('You are signed out.').waitFor();
    // Back to the provider's logout page, then to the app's page that showed alice's photos.
    await page.goBack();
    await page.goBack();
    expect(page.url()).toBe(`${whole.running.appUrl}/`);
    const main = (await page.locator('main').textContent()) ?? '';
    expect(main).not.toContain('Tea party');
    expect(main).not.toContain(alice?.name ?? 'alice');
    expect(await page.getByRole('link', { name: 'Sign in' }).count()).toBe(1);
    await context.close();
  });

  it('pins: a charge from a form left open past the access token expiry is created once, after a refresh', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    // The access token expired while the form was open (no waiting: the session says so).
    // The tokens are sealed with the session id (sealed-tokens.ts): resealed with it, from the cookie.
    const id = (await context.cookies()).find((cookie) => cookie.name === 'app_session')!.value;
    const hash = createHash('sha256').update(id).digest('base64url');
    const { rows } = await whole.db.query<{ sealed: unknown }>(
      "select data -> 'sealed' as sealed from app_sessions where id_hash = $1",
      [hash],
    );
    const expired = { ...openTokens(id, hash, rows[0]?.sealed)!, expiresAt: 0 };
    await whole.db.query(`update app_sessions set data = jsonb_set(data, '{sealed}', $2::jsonb) where id_hash = $1`, [
      hash,
      JSON.stringify(sealTokens(id, hash, expired)),
    ]);
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('5101');
    await page.getByRole('button', { name: 'Create charge' }).click();
    await flash(page).waitFor();
    expect(await flash(page).textContent()).toContain('Charge created.');
    expect(await charges(5101)).toBe(1);
    await context.close();
  });

  // Was a defect: a second click on "Create charge" while the first one's answer is still on its way (a double
  // click, or a second click because "nothing happened") creates a second charge. The form carries no
  // idempotency key: each POST /charges makes @idem/client mint a new one, so the same logical operation
  // goes out under two keys. Spec 1 and 2.1: "Each logical operation carries one idempotency key ... A
  // new key per retry is wrong"; 3.1 rule 1: exactly one side effect. Expected: the form carries a key
  // made when the page was rendered (or the app otherwise ties both submits to one key), so the second
  // submit replays the first charge and the database holds one.
  /**
   * Signs in, fills "Create charge" with `amount` and clicks it twice, the second click landing while
   * the first POST (which reached the app and charged) is still waiting for its answer. Returns how
   * many POSTs left the page, and the page.
   */
  async function doubleClickCharge(context: BrowserContext, amount: number) {
    const page = await signIn(context);
    // The page's clock stands still: however slow the first answer under load, the second click
    // comes within the 2 s in which a keyed form is not sent again.
    await context.clock.setFixedTime(Date.now());
    await page.getByRole('spinbutton', { name: 'Amount' }).fill(String(amount));
    const button = page.getByRole('button', { name: 'Create charge' });
    await button.scrollIntoViewIfNeeded();
    const box = await button.boundingBox();
    if (!box) throw new Error('no button');
    const firstAnswered = gate();
    const secondClicked = gate();
    let posts = 0;
    await page.route('**/charges', async (route) => {
      posts += 1;
      if (posts > 1) {
        await route.continue();
        return;
      }
      const response = await route.fetch({ maxRedirects: 0 });
      firstAnswered.open();
      await secondClicked.promise;
      await route.fulfill({ response }).catch(() => {
        // The browser dropped the first navigation for the second submit: nothing to hand over.
      });
    });
    await clickAgain(page, box);
    await firstAnswered.promise;
    await clickAgain(page, box);
    secondClicked.open();
    await flash(page).waitFor();
    return { posts, page };
  }

  it('creates one charge when "Create charge" is clicked twice before the page answers', async () => {
    // Every page sends a form once: the second click sends nothing.
    const context = await browser.newContext();
    const { posts, page } = await doubleClickCharge(context, 5201);
    expect(posts).toBe(1);
    expect(await charges(5201)).toBe(1);
    expect(await flash(page).textContent()).toContain('Replayed: no');
    await context.close();
  });

  it('creates one charge for a form sent twice where no script holds the second back', async () => {
    // Without scripts (or a reload that sends the form again), both submits leave; the key rendered
    // into the form makes them one operation, and the API answers the second with the first charge.
    const context = await browser.newContext({ javaScriptEnabled: false });
    const { posts, page } = await doubleClickCharge(context, 5202);
    expect(posts).toBe(2);
    expect(await charges(5202)).toBe(1);
    expect(await flash(page).textContent()).toContain('Replayed: yes');
    await context.close();
  });

  // Was a defect: two tabs each create a charge; the tab whose answer comes back second shows nothing about
  // its charge. The outcome lives in one "flash" slot per session: tab B's result overwrites tab A's, B
  // shows its own, and A's page has no "Charge created.", no key and no "Send the same charge again
  // (same key)". A user then cannot tell whether A's charge happened, and the only way to try again is a
  // new charge under a new key (spec 2.1: the same key on every retry; README: "a flash set meanwhile
  // shows"). Expected: each tab shows the outcome and key of its own charge.
  it('shows each of two tabs the outcome of its own charge', async () => {
    const context = await browser.newContext();
    const a = await signIn(context);
    const b = await newPage(context);
    await b.goto(whole.running.appUrl);
    await a.getByRole('spinbutton', { name: 'Amount' }).fill('5301');
    await b.getByRole('spinbutton', { name: 'Amount' }).fill('5302');
    const aAnswered = gate();
    const bDone = gate();
    await a.route('**/charges', async (route) => {
      const response = await route.fetch({ maxRedirects: 0 });
      aAnswered.open();
      await bDone.promise;
      await route.fulfill({ response });
    });
    await a.getByRole('button', { name: 'Create charge' }).click({ noWaitAfter: true });
    await aAnswered.promise;
    await b.getByRole('button', { name: 'Create charge' }).click();
    await flash(b).waitFor();
    expect(await flash(b).textContent()).toContain('"amount":5302');
    bDone.open();
    // The page its post/redirect/get lands on names the message's slot (the tab was on `/` before).
    await a.waitForURL((url) => url.searchParams.has('shown'));
    await a.locator('h1').waitFor();
    expect(await charges(5301)).toBe(1);
    expect(await charges(5302)).toBe(1);
    expect(await flash(a).count()).toBe(1);
    expect(await flash(a).textContent()).toContain('"amount":5301');
    await context.close();
  });

  // Was a defect: signed out in one tab, a person submits "Create charge" in another tab that still shows the
  // signed-in page, and gets a 403 "Sign-in failed: This form was not sent from this app." The form was
  // sent from this app, and nobody was signing in: the sign-out removed the session cookie, so the
  // request fails the CSRF check (bound to the session) before the app looks at the session. A session
  // that merely expired gets the start page instead (withSession's redirect). Expected: the same as
  // for an ended session: no 403 accusing a forgery; the page says the user is signed out and offers
  // "Sign in" (and nothing was charged, which holds today).
  it('answers a form sent after sign-out in another tab with "signed out", not a forged-form 403', async () => {
    const context = await browser.newContext();
    const a = await signIn(context);
    const b = await newPage(context);
    await b.goto(whole.running.appUrl);
    await a.getByRole('button', { name: 'Sign out' }).click();
    await a.getByRole('button', { name: 'Yes, sign me out' }).click();
    await a.getByText('You are signed out.').waitFor();

    await b.getByRole('spinbutton', { name: 'Amount' }).fill('5401');
    const answer = b.waitForResponse((response) => response.request().method() === 'POST');
    await b.getByRole('button', { name: 'Create charge' }).click();
    const status = (await answer).status();
    await b.locator('h1').waitFor();
    const main = (await b.locator('main').textContent()) ?? '';
    expect(await charges(5401)).toBe(0);
    expect(main).not.toContain('This form was not sent from this app');
    expect(status).not.toBe(403);
    expect(await b.getByRole('link', { name: 'Sign in' }).count()).toBe(1);
    await context.close();
  });

  // Was a defect: two tabs of the photo app, both showing "Sign in" (say after the session ended), and the
  // person signs in from both, finishing the first tab first: neither tab ends signed in. Each "Sign in"
  // starts a transaction in a new session and sets the one session cookie, so the second replaces the
  // first. The first tab's callback then meets the second's transaction: its `state` does not match
  // ("The sign-in could not be completed"), and the callback has already deleted that transaction before
  // checking, so the second tab fails too ("This sign-in is unknown or was already used"). Spec 5.6: the
  // user logs in at the provider and the app exchanges the code. Expected: at least one of the two
  // tabs ends signed in (best: a callback whose state is not the session's leaves the session's
  // transaction alone, or transactions are kept per state).
  it('signs in from one of two tabs that both pressed "Sign in"', async () => {
    const context = await browser.newContext();
    const first = await newPage(context);
    const second = await newPage(context);
    for (const page of [first, second]) {
      await page.goto(whole.running.appUrl);
      await page.getByRole('link', { name: 'Sign in' }).click();
      await page.getByLabel('Username').waitFor();
    }
    for (const page of [first, second]) {
      await page.getByLabel('Username').fill('alice');
      await page.getByLabel('Password').fill(alice?.password ?? '');
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.getByRole('heading', { name: 'Allow access' }).waitFor();
      await page.getByRole('button', { name: 'Allow' }).click();
      await page.waitForURL((url) => url.href.startsWith(whole.running.appUrl));
      await page.locator('h1').waitFor();
    }
    const signedIn = [await first.locator('#user-name').count(), await second.locator('#user-name').count()].reduce(
      (sum, n) => sum + n,
      0,
    );
    expect(signedIn).toBeGreaterThan(0);
    await context.close();
  });

  describe('at the identity provider, for a client whose callback is slow', () => {
    let tool: Awaited<ReturnType<typeof listen>>;
    const held: ServerResponse[] = [];
    let callbackReached = gate();

    beforeAll(async () => {
      tool = await listen(0);
      tool.use((req: IncomingMessage, res: ServerResponse) => {
        if (!req.url?.startsWith('/callback')) {
          res.writeHead(404).end();
          return;
        }
        // The first callback is answered only at the end of the test: a slow client.
        if (held.length === 0) {
          held.push(res);
          callbackReached.open();
          return;
        }
        res.writeHead(200, { 'content-type': 'text/plain' }).end('signed in');
      });
    });

    afterAll(async () => {
      for (const res of held) res.destroy();
      await tool?.close();
    });

    // Was a defect: a double click on "Allow" (the second click lands while the client's callback is still
    // loading) ends on the provider's "Sign-in expired: This sign-in link is no longer valid", a dead end
    // with no way back, although the person allowed access. The first POST finished the interaction
    // and the resume consumed it; the second POST finds no interaction and gets the 400 error page.
    // Spec 5.6 (c): the provider redirects back with a code. Now every page sends a form once (a
    // script its CSP allows by hash), so the second click sends nothing and the browser gets back to
    // the client (here, its redirect URI).
    it('brings the person back to the client after a double click on "Allow"', async () => {
      callbackReached = gate();
      const redirectUri = `http://127.0.0.1:${tool.port}/callback`;
      const url = new URL('/auth', whole.running.authUrl);
      for (const [name, value] of Object.entries({
        client_id: whole.running.clients.publicClient.clientId,
        redirect_uri: redirectUri,
        response_type: 'code',
        scope: 'openid profile',
        state: 'tool-state',
        prompt: 'consent',
        code_challenge: 'E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM',
        code_challenge_method: 'S256',
      }))
        url.searchParams.set(name, value);
      const context = await browser.newContext();
      const page = await newPage(context);
      await page.goto(url.href);
      await page.getByLabel('Username').fill('alice');
      await page.getByLabel('Password').fill(alice?.password ?? '');
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.getByRole('heading', { name: 'Allow access' }).waitFor();
      const box = await page.getByRole('button', { name: 'Allow' }).boundingBox();
      if (!box) throw new Error('no button');
      await clickAgain(page, box);
      await callbackReached.promise;
      // The consent page is still on screen (its navigation waits for the client): the second click
      // sends nothing, so the first navigation goes on to the client.
      let consentPosts = 0;
      page.on('request', (request) => {
        if (request.method() === 'POST') consentPosts += 1;
      });
      await clickAgain(page, box);
      for (const res of held.splice(0)) res.writeHead(200, { 'content-type': 'text/plain' }).end('signed in');
      await page.waitForURL((url) => url.href.startsWith(redirectUri));
      expect(consentPosts).toBe(0);
      expect(await page.locator('body').textContent()).toContain('signed in');
      await context.close();
    });
  });

  it('pins: no page error, CSP violation or failing script in any of these stories', () => {
    expect(problems).toEqual([]);
  });
});
