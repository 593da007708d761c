// Audit: what a person does to a form of the third-party app when the answer is slow or lost: a double
// submit, Enter twice, Back, F5, two tabs, a held API, a dropped connection, a session that ended
// between render and submit, a form from an earlier sign-in. Each story checks one charge per intent,
// a truthful message, and a new key per rendered form, except the key of a charge sent whose outcome
// no page has shown yet: that one comes back. Real chromium, real stack, no store mocks.
import { createHash, randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import type pg from 'pg';
import { type APIResponse, type Browser, type BrowserContext, chromium, type Page, type Route } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startResourceStack } from '../src/api/resource-stack.js';
import { listen } from '../src/listen.js';
import { demoUsers } from '../src/seed.js';
import { startReferenceApp } from '../src/start.js';
import { chromiumOptions, hasChromium } from './chromium.js';
import { closeTestRedis, openTestDatabase } from './services.js';

const alice = demoUsers.find((user) => user.username === 'alice');

/** A promise and the function that settles it. */
function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

/** The whole stack on this file's database and a Redis prefix of its own (`audit-browser:`). */
async function startStack() {
  const db = await openTestDatabase('form_retries');
  const url = process.env.REDIS_URL;
  let redis: { client: Redis; prefix: string } | undefined;
  if (url) {
    const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 });
    client.on('error', () => undefined);
    await client.connect();
    redis = { client, prefix: `audit-browser:form-retries:${randomBytes(5).toString('hex')}:` };
  }
  const gatewayPort = await listen(0);
  // "Create charge" retries at once: a held API answers its retries 409 without the test waiting 1, 2, 4 s.
  const running = await startReferenceApp({
    db,
    authPort: 0,
    appPort: 0,
    baseUrl: gatewayPort.url,
    retryTiming: { sleep: async () => undefined },
  });
  const stack = await startResourceStack({
    db,
    gatewayPort,
    apiPort: 0,
    receiverPort: 0,
    baseUrl: gatewayPort.url,
    authUrl: running.authUrl,
    relay: false,
    ...(redis ? { redis } : {}),
  });
  return {
    db,
    running,
    async close() {
      await stack.close();
      await running.close();
      await closeTestRedis(redis);
      await db.close();
    },
  };
}

describe.runIf(hasChromium)('the third-party app in a real browser: retries of its forms', () => {
  let whole: Awaited<ReturnType<typeof startStack>>;
  let browser: Browser;
  /**
   * Chromium as people run it: with the back/forward cache that playwright turns off by default. A
   * page left by a form (no-store or not) comes back from it on Back, scripts' state and all.
   */
  let withCache: Browser;

  beforeAll(async () => {
    whole = await startStack();
    browser = await chromium.launch(chromiumOptions);
    withCache = await chromium.launch({ ...chromiumOptions, ignoreDefaultArgs: ['--disable-back-forward-cache'] });
  }, 120_000);

  afterAll(async () => {
    await withCache?.close();
    await browser?.close();
    await whole?.close();
  });

  /** Opens the app in a new tab of `context` and signs in as alice (login, Allow). */
  async function signIn(context: BrowserContext): Promise<Page> {
    const page = await context.newPage();
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

  const charges = async (amount: number) =>
    (await whole.db.query<{ n: number }>('select count(*)::int as n from api_charges where amount = $1', [amount]))
      .rows[0]?.n;

  const flash = (page: Page) => page.locator('section[aria-labelledby="flash"]');
  /** The key the "Create charge" form of the page carries. */
  const formKey = (page: Page) =>
    page.locator('section[aria-labelledby="charge"] input[name="key"]').getAttribute('value');
  /** Counts the POSTs the page sends to /charges. */
  const countPosts = (page: Page) => {
    const counter = { n: 0 };
    page.on('request', (request) => {
      if (request.method() === 'POST' && new URL(request.url()).pathname === '/charges') counter.n += 1;
    });
    return counter;
  };

  /** Ends the app session of `context` as its expiry would (no waiting: the row says so). */
  async function expireSession(context: BrowserContext) {
    const cookie = (await context.cookies()).find((c) => c.name === 'app_session');
    if (!cookie) throw new Error('no session cookie');
    const idHash = createHash('sha256').update(cookie.value).digest('base64url');
    const { rowCount } = await whole.db.query(
      `update app_sessions set expires_at = now() - interval '1 second' where id_hash = $1`,
      [idHash],
    );
    expect(rowCount).toBe(1);
  }

  /**
   * Routes the first POST /charges of `page` through the test: the app answers it in full (the charge
   * is made), then the test decides what the browser gets with `then`, while later POSTs go straight on.
   */
  async function holdFirstAnswer(page: Page, then: (route: Route, response: APIResponse) => Promise<void>) {
    const answered = gate();
    const release = gate();
    let first = true;
    await page.route('**/charges', async (route) => {
      if (!first) {
        await route.continue();
        return;
      }
      first = false;
      const response = await route.fetch({ maxRedirects: 0 });
      answered.open();
      await release.promise;
      await then(route, response).catch(() => {
        // The browser dropped this navigation for a later one: nothing to hand over.
      });
    });
    return { answered: answered.promise, release: release.open };
  }

  it('holds: Enter pressed twice in "Amount" before the answer sends one POST and makes one charge', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    const posts = countPosts(page);
    const held = await holdFirstAnswer(page, (route, response) => route.fulfill({ response }));
    const amount = page.getByRole('spinbutton', { name: 'Amount' });
    await amount.fill('6101');
    await amount.press('Enter', { noWaitAfter: true });
    await held.answered;
    // The page is still on screen (its navigation waits for the answer), and so is the focus.
    await page.keyboard.press('Enter');
    held.release();
    await flash(page).waitFor();
    expect(posts.n).toBe(1);
    expect(await charges(6101)).toBe(1);
    expect(await flash(page).textContent()).toContain('Charge created.');
    await context.close();
  });

  it('holds: five clicks without scripts send five POSTs under one key, one charge, and say "created"', async () => {
    const context = await browser.newContext({ javaScriptEnabled: false });
    const page = await signIn(context);
    const key = await formKey(page);
    const sent: string[] = [];
    page.on('request', (request) => {
      if (request.method() === 'POST') sent.push(new URLSearchParams(request.postData() ?? '').get('key') ?? '');
    });
    const held = await holdFirstAnswer(page, (route, response) => route.fulfill({ response }));
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('6102');
    const button = page.getByRole('button', { name: 'Create charge' });
    await button.scrollIntoViewIfNeeded();
    const box = await button.boundingBox();
    if (!box) throw new Error('no button');
    await button.click({ noWaitAfter: true });
    await held.answered;
    // Clicks as a mouse makes them, while the page still waits for the first answer.
    for (let i = 0; i < 4; i += 1) await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
    held.release();
    await flash(page).waitFor();
    // Each click that lands sends the form (a click during the page's own navigation may merge).
    expect(sent.length).toBeGreaterThanOrEqual(2);
    expect(new Set(sent)).toEqual(new Set([key]));
    expect(await charges(6102)).toBe(1);
    const text = (await flash(page).textContent()) ?? '';
    expect(text).toContain('Charge created.');
    expect(text).toContain('Replayed: yes');
    await context.close();
  });

  it('holds: F5 on the page a charge lands on sends nothing again; each render mints a new key', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    const before = await formKey(page);
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('6201');
    await page.getByRole('button', { name: 'Create charge' }).click();
    await flash(page).waitFor();
    expect(await flash(page).textContent()).toContain(`Idempotency-Key: ${before}`);
    const after = await formKey(page);
    const posts = countPosts(page);
    await page.reload();
    await page.locator('#user-name').waitFor();
    expect(posts.n).toBe(0);
    expect(await charges(6201)).toBe(1);
    expect(new Set([before, after, await formKey(page)]).size).toBe(3);
    await context.close();
  });

  it('holds: the same form in two tabs is two forms (two keys), each charged once and told its own', async () => {
    const context = await browser.newContext();
    const a = await signIn(context);
    const b = await context.newPage();
    await b.goto(whole.running.appUrl);
    const [keyA, keyB] = [await formKey(a), await formKey(b)];
    expect(keyA).not.toBe(keyB);
    for (const tab of [a, b]) {
      await tab.getByRole('spinbutton', { name: 'Amount' }).fill('6301');
      await tab.getByRole('button', { name: 'Create charge' }).click();
      await flash(tab).waitFor();
    }
    expect(await charges(6301)).toBe(2);
    expect(await flash(a).textContent()).toContain(`Idempotency-Key: ${keyA}`);
    expect(await flash(b).textContent()).toContain(`Idempotency-Key: ${keyB}`);
    await context.close();
  });

  it('holds: the connection dropped after the charge, Reload on the error page replays it as created', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    const key = await formKey(page);
    const held = await holdFirstAnswer(page, (route) => route.abort('connectionreset'));
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('6401');
    const click = page
      .getByRole('button', { name: 'Create charge' })
      .click()
      .catch(() => undefined);
    await held.answered;
    held.release();
    await click;
    await page.waitForURL((url) => url.protocol === 'chrome-error:');
    expect(await charges(6401)).toBe(1);
    // Chromium's "Reload" on its error page sends the form again, with the same key.
    await page.reload();
    await flash(page).waitFor();
    const text = (await flash(page).textContent()) ?? '';
    expect(text).toContain('Charge created.');
    expect(text).toContain(`Idempotency-Key: ${key}`);
    expect(text).toContain('Replayed: yes');
    expect(await charges(6401)).toBe(1);
    await context.close();
  });

  /**
   * Sends "Create charge" for `amount` from `page` and loses its answer after the app made the charge
   * (the connection dropped: as for Stop, or a closed tab, the browser never sees the redirect). The
   * page is left on chromium's error page.
   */
  async function chargeAndLoseAnswer(page: Page, amount: number) {
    const held = await holdFirstAnswer(page, (route) => route.abort('connectionreset'));
    await page.getByRole('spinbutton', { name: 'Amount' }).fill(String(amount));
    const click = page
      .getByRole('button', { name: 'Create charge' })
      .click()
      .catch(() => undefined);
    await held.answered;
    held.release();
    await click;
    await page.waitForURL((url) => url.protocol === 'chrome-error:');
    await page.unrouteAll({ behavior: 'ignoreErrors' });
    expect(await charges(amount)).toBe(1);
  }

  /** The sentence the "Create charge" section says about a charge whose outcome no page showed yet. */
  const chargeNotice = (page: Page) => page.locator('section[aria-labelledby="charge"] [role="status"]');

  // Was wrong: the answer to "Create charge" is lost after the app made the charge (the connection
  // dropped; or the person pressed Stop, or closed the tab); the person goes Back, and the page they
  // get says nothing of it. Its outcome waited in a flash slot that only the lost redirect named, and
  // the fresh form had a new key, so sending it again made a second charge: one intent, two charges
  // (spec 2.1: the same key on every retry of one operation). Decided: the app keeps the key of a sent
  // charge until a page has shown its outcome. The form comes back with that key and its amount, and
  // says the charge went through; sent again as it is, it replays. The next form is a new charge.
  it('tells a person who goes Back after a lost answer that the charge went through, and keeps its key', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    const key = await formKey(page);
    await chargeAndLoseAnswer(page, 6402);
    await page.goBack();
    await page.locator('#user-name').waitFor();
    try {
      expect(await chargeNotice(page).textContent()).toContain('Your charge of 6402 EUR went through');
      expect(await page.title()).toContain('Your charge of 6402 EUR went through');
      expect(await formKey(page)).toBe(key);
      // The person did not read it, and sends the form again: the API answers with the first outcome.
      await page.getByRole('button', { name: 'Create charge' }).click();
      await flash(page).waitFor();
      const text = (await flash(page).textContent()) ?? '';
      expect(text).toContain('Charge created.');
      expect(text).toContain(`Idempotency-Key: ${key}`);
      expect(text).toContain('Replayed: yes');
      expect(await charges(6402)).toBe(1);
      // Its outcome shown, the charge is over: the form under it, and the next page's, start a new one.
      expect(await chargeNotice(page).count()).toBe(0);
      const next = await formKey(page);
      expect(next).not.toBe(key);
      await page.goto(whole.running.appUrl);
      expect(await chargeNotice(page).count()).toBe(0);
      expect(await formKey(page)).not.toBe(key);
    } finally {
      await context.close();
    }
  });

  // The kept form has the key of a charge that went through: another amount under it is not that
  // charge. The API refuses it (422 fingerprint_mismatch, spec part 7) and runs nothing; the page must
  // say so in words, with what did go through and how to make the new charge, not "The API refused: 422".
  it('answers another amount under a kept key in words: the first charge stands, nothing new was charged', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    const key = await formKey(page);
    await chargeAndLoseAnswer(page, 6403);
    await page.goBack();
    await page.locator('#user-name').waitFor();
    try {
      await page.getByRole('spinbutton', { name: 'Amount' }).fill('6404');
      await page.getByRole('button', { name: 'Create charge' }).click();
      await flash(page).waitFor();
      const text = (await flash(page).textContent()) ?? '';
      expect(text).toContain('Not charged');
      expect(text).toContain('Your charge of 6403 EUR went through');
      expect(text).toContain('send the form below');
      expect(text).toContain(`Idempotency-Key: ${key}`);
      expect(text).not.toContain('The API refused');
      expect(await page.title()).toContain('Not charged');
      expect([await charges(6403), await charges(6404)]).toEqual([1, 0]);
      // The form below is a new charge.
      expect(await formKey(page)).not.toBe(key);
      await page.getByRole('spinbutton', { name: 'Amount' }).fill('6404');
      await page.getByRole('button', { name: 'Create charge' }).click();
      await page.getByText('Replayed: no').waitFor();
      expect([await charges(6403), await charges(6404)]).toEqual([1, 1]);
    } finally {
      await context.close();
    }
  });

  // Two tabs of one session share the kept key of a charge whose answer was lost: the app cannot tell
  // a tab opened to check on it from the tab Back brought. Each shows it, and once one has shown its
  // outcome, neither offers the key again. Forms never sent stay one key per rendered form (above).
  it('shows a charge whose answer was lost in another tab too, and its outcome once', async () => {
    const context = await browser.newContext();
    const a = await signIn(context);
    const key = await formKey(a);
    await chargeAndLoseAnswer(a, 6405);
    try {
      const b = await context.newPage();
      await b.goto(whole.running.appUrl);
      expect(await chargeNotice(b).textContent()).toContain('Your charge of 6405 EUR went through');
      expect(await formKey(b)).toBe(key);
      await b.getByRole('button', { name: 'Create charge' }).click();
      await b.getByText('Replayed: yes').waitFor();
      expect(await charges(6405)).toBe(1);
      await a.goBack();
      await a.locator('#user-name').waitFor();
      expect(await chargeNotice(a).count()).toBe(0);
      expect(await formKey(a)).not.toBe(key);
    } finally {
      await context.close();
    }
  });

  it('holds: a form sent again while the API is held says "still in progress", and its retry replays one charge', async () => {
    if (whole.db.kind !== 'postgres') return;
    const context = await browser.newContext({ javaScriptEnabled: false });
    const page = await signIn(context);
    const key = await formKey(page);
    // The API is slow: its insert of the charge waits for a lock the test holds.
    const holder = await (whole.db.client as pg.Pool).connect();
    const waiting = async () =>
      (
        await whole.db.query<{ n: number }>(
          `select count(*)::int as n from pg_stat_activity
           where datname = current_database() and wait_event_type = 'Lock' and query like 'insert into api_charges%'`,
        )
      ).rows[0]?.n;
    try {
      await holder.query('begin');
      await holder.query('lock table api_charges in exclusive mode');
      await page.getByRole('spinbutton', { name: 'Amount' }).fill('6501');
      const button = page.getByRole('button', { name: 'Create charge' });
      await button.scrollIntoViewIfNeeded();
      const box = await button.boundingBox();
      if (!box) throw new Error('no button');
      await button.click({ noWaitAfter: true });
      await expect.poll(waiting, { timeout: 10_000 }).toBe(1);
      // "Nothing happens": the person sends the form again (no script holds it back), same key.
      await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
      await flash(page).waitFor();
      const text = (await flash(page).textContent()) ?? '';
      expect(text).toContain('Still in progress at the API (409)');
      expect(text).toContain(`Idempotency-Key: ${key}`);
    } finally {
      await holder.query('commit').catch(() => undefined);
      holder.release();
    }
    // The first attempt goes on once the API is free; the person's retry (same key) is answered by it.
    await expect.poll(() => charges(6501), { timeout: 10_000 }).toBe(1);
    await page.getByRole('button', { name: 'Send the same charge again (same key)' }).click();
    await page.getByText('Replayed: yes').waitFor();
    const text = (await flash(page).textContent()) ?? '';
    expect(text).toContain('Charge created.');
    expect(text).toContain(`Idempotency-Key: ${key}`);
    expect(await charges(6501)).toBe(1);
    await context.close();
  });

  // Was wrong: with the back/forward cache chromium runs with (playwright alone turns it off), Back
  // from the page a charge lands on brings back the page the form was sent from as it was left: its
  // form marked sent by the send-once script, so "Create charge" (and every other form there) does
  // nothing at all, with no word why. The person's only way on is a reload they are not told about.
  // Now a page restored from that cache reloads: a fresh render, with a new key for a new charge.
  it('sends "Create charge" from a page that Back brought out of the back/forward cache', async () => {
    const context = await withCache.newContext();
    const page = await signIn(context);
    const first = await formKey(page);
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('6601');
    await page.getByRole('button', { name: 'Create charge' }).click();
    await flash(page).waitFor();
    await page.goBack({ waitUntil: 'commit' });
    await expect.poll(async () => (await formKey(page).catch(() => null)) ?? first).not.toBe(first);
    const posts = countPosts(page);
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('6602');
    await page.getByRole('button', { name: 'Create charge' }).click();
    await page.waitForURL((url) => url.searchParams.has('shown'), { timeout: 10_000 });
    await flash(page).waitFor();
    expect(posts.n).toBe(1);
    expect(await flash(page).textContent()).toContain('Charge created.');
    expect(await flash(page).textContent()).not.toContain(first);
    expect([await charges(6601), await charges(6602)]).toEqual([1, 1]);
    await context.close();
  });

  it('holds: Back after sign-out, even with the back/forward cache, shows nothing of the session', async () => {
    const context = await withCache.newContext();
    const page = await signIn(context);
    expect(await page.locator('main').textContent()).toContain('Tea party');
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByRole('button', { name: 'Yes, sign me out' }).click();
    await page.getByText('You are signed out.').waitFor();
    // Two steps back at once, past the provider's logout page, to the page that showed alice's photos
    // (two goBack calls race playwright's own bookkeeping of a page swapped in from the cache).
    await page.evaluate(() => history.go(-2)).catch(() => undefined);
    await page.waitForURL(`${whole.running.appUrl}/`, { waitUntil: 'commit' });
    await page.getByRole('link', { name: 'Sign in' }).waitFor();
    expect(await page.locator('main').textContent()).not.toContain('Tea party');
    await context.close();
  });

  // Was wrong: the person presses Stop (Esc) while "Create charge" waits for a slow answer, then
  // clicks "Create charge" again: nothing was sent and nothing said why, because the send-once script
  // marked the form sent and nothing unmarked it. Their way on was a reload, whose new key makes a
  // second charge if the first went through meanwhile. Decided: a form that carries an idempotency
  // key may be sent again 2 s after the last send (the same key: the API replays); a double click
  // still sends once. The page's clock is set, not waited for.
  it('sends the form again after the person pressed Stop during a slow answer', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    const startedAt = Date.now();
    await context.clock.setFixedTime(startedAt);
    try {
      const held = await holdFirstAnswer(page, (route, response) => route.fulfill({ response }));
      await page.getByRole('spinbutton', { name: 'Amount' }).fill('6701');
      const button = page.getByRole('button', { name: 'Create charge' });
      await button.scrollIntoViewIfNeeded();
      const box = await button.boundingBox();
      if (!box) throw new Error('no button');
      await button.click({ noWaitAfter: true });
      await held.answered;
      // The browser's Stop (page scripts cannot run while the navigation is pending).
      await (await context.newCDPSession(page)).send('Page.stopLoading');
      held.release();
      expect(await charges(6701)).toBe(1);
      await page.unrouteAll({ behavior: 'ignoreErrors' });
      // Within 2 s of the first send, a click sends nothing (a double click); past them, it does.
      let posted = 0;
      page.on('request', (request) => {
        if (request.method() === 'POST') posted++;
      });
      await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
      // Time for a send the click would have started to show (its absence cannot be awaited).
      await page.waitForTimeout(500);
      expect(posted).toBe(0);
      await context.clock.setFixedTime(startedAt + 2500);
      const again = page.waitForRequest((request) => request.method() === 'POST', { timeout: 3000 });
      await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
      await again;
      await flash(page).waitFor({ timeout: 5000 });
      expect(await flash(page).textContent()).toContain('Replayed: yes');
    } finally {
      await context.close();
    }
  });

  // Was wrong: a session that ended between the render of the page and the submit (it expired, or the
  // provider revoked its grant) sent the person to the signed-out start page with no word about the
  // charge they had just asked for: did it go through? Now the page says nothing was done.
  it('tells a person whose session ended before the form arrived that nothing was charged', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    await expireSession(context);
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('6801');
    await page.getByRole('button', { name: 'Create charge' }).click();
    await page.getByRole('link', { name: 'Sign in' }).waitFor();
    expect(await charges(6801)).toBe(0);
    expect(await page.locator('main [role="status"]').allTextContents()).toEqual([
      expect.stringContaining('nothing was done'),
    ]);
    await context.close();
  });

  // Was wrong: a page left open from before the person signed in again (in another tab) sends its form
  // with the CSRF token of the old session, and got "Request refused: This form was not sent from this
  // app." The form was sent from this app: the page only said something untrue and never how to go
  // on. The token cannot tell an out-of-date form from a forged one, so the page now names both, says
  // nothing was done, and how to send it again.
  it('answers a form from before a new sign-in truthfully: out of date, nothing done, reload', async () => {
    const context = await browser.newContext();
    const a = await signIn(context);
    const b = await context.newPage();
    await b.goto(`${whole.running.appUrl}/signin`);
    await b.getByRole('button', { name: 'Sign in again' }).click();
    // The old grant was revoked: the provider asks again (its own session skips the login).
    const allow = b.getByRole('button', { name: 'Allow' });
    await allow.or(b.locator('#user-name')).waitFor();
    if (await allow.count()) await allow.click();
    await b.locator('#user-name').waitFor();
    await a.getByRole('spinbutton', { name: 'Amount' }).fill('6901');
    await a.getByRole('button', { name: 'Create charge' }).click();
    await a.locator('h1').waitFor();
    const main = (await a.locator('main').textContent()) ?? '';
    expect(await charges(6901)).toBe(0);
    expect(main).not.toContain('This form was not sent from this app.');
    expect(main).toContain('Nothing was done');
    await a.getByRole('link', { name: 'Back' }).click();
    await a.getByRole('spinbutton', { name: 'Amount' }).fill('6901');
    await a.getByRole('button', { name: 'Create charge' }).click();
    await flash(a).waitFor();
    expect(await charges(6901)).toBe(1);
    await context.close();
  });

  // Was wrong: the page a charge lands on (post/redirect/get) was titled "Photo app" like any other, its
  // outcome in a status region further down. A live region present when a page loads is not
  // announced, and the title is what a screen reader reads first: someone who cannot see the page
  // heard nothing of "Charge created." or "Still in progress" until they went looking (WCAG 2.4.2;
  // the app's error pages are titled for what happened already). Now the title names the outcome.
  it('titles the page a form lands on with its outcome, a replay as created', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    expect(await page.title()).toBe('Photo app');
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('7001');
    await page.getByRole('button', { name: 'Create charge' }).click();
    await flash(page).waitFor();
    expect(await page.title()).toBe('Create charge: Charge created. - Photo app');
    await page.getByRole('button', { name: 'Send the same charge again (same key)' }).click();
    await page.getByText('Replayed: yes').waitFor();
    expect(await page.title()).toBe('Create charge: Charge created. - Photo app');
    expect(await charges(7001)).toBe(1);
    await context.close();
  });

  it('holds: a form sent while offline charges nothing; Reload once back online sends it once', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    const key = await formKey(page);
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('7101');
    await context.setOffline(true);
    await page
      .getByRole('button', { name: 'Create charge' })
      .click()
      .catch(() => undefined);
    await page.waitForURL((url) => url.protocol === 'chrome-error:');
    expect(await charges(7101)).toBe(0);
    await context.setOffline(false);
    await page.reload();
    await flash(page).waitFor();
    expect(await flash(page).textContent()).toContain(`Idempotency-Key: ${key}`);
    expect(await charges(7101)).toBe(1);
    await context.close();
  });

  // Was wrong: an amount over the API's limit came back as "The API refused: 422 The request is not
  // valid", and nothing said what to change. Now the page carries the API's problem detail too.
  it('says what to change when the API refuses a charge (an amount over the limit)', async () => {
    const context = await browser.newContext();
    const page = await signIn(context);
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('999999999999');
    await page.getByRole('button', { name: 'Create charge' }).click();
    await flash(page).waitFor();
    const text = (await flash(page).textContent()) ?? '';
    expect(text).toContain('The API refused: 422');
    expect(text).toMatch(/amount must be an integer from 1 to \d+/);
    // Nothing ran, so there is no "send the same charge again": the key is not offered for a retry.
    expect(await page.getByRole('button', { name: 'Send the same charge again (same key)' }).count()).toBe(0);
    await context.close();
  });
});
