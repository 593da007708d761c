// The reference app's pages for a person on a keyboard, with a screen reader, zoomed in or on a narrow
// screen (WCAG 2.2 AA), checked in a real browser: the accessibility tree over CDP, computed styles,
// screenshots of the focus, Tab and Enter and Space. No checker library: what is checked is in a11y.ts.
import { type Browser, type BrowserContext, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { homePage } from '../src/app/pages.js';
import { pageHeaders } from '../src/html.js';
import { consentPage, formPostPage, invalidLoginMessage, switchAccountPage } from '../src/idp/pages.js';
import { demoUsers } from '../src/seed.js';
import {
  axControls,
  contrastFailures,
  documentFacts,
  focusIndicator,
  sidewaysOverflow,
  tabStops,
  textSpacingLosses,
} from './a11y.js';
import { chromiumOptions, hasChromium } from './chromium.js';
import { startWholeStack, type WholeStack } from './test-stack.js';

const alice = demoUsers.find((user) => user.username === 'alice');
const focusable = 'a[href], button, input:not([type=hidden]), select';

describe.runIf(hasChromium)('the reference app for keyboard and screen reader users (WCAG 2.2 AA)', () => {
  let whole: WholeStack;
  let browser: Browser;

  beforeAll(async () => {
    whole = await startWholeStack('a11y_audit');
    browser = await chromium.launch(chromiumOptions);
  }, 120_000);

  afterAll(async () => {
    await browser?.close();
    await whole?.close();
  });

  const newContext = () => browser.newContext({ viewport: { width: 1000, height: 700 } });

  /**
   * What is wrong with the page as it stands, one line per problem: the document (lang, title, one
   * h1, unique ids), the controls (a name each), contrast, reflow at 320 CSS px (a data table may
   * scroll on its own), text spacing, the tab order (document order, no trap) and a visible focus.
   */
  async function problemsOf(page: Page, name: string): Promise<string[]> {
    const problems: string[] = [];
    const say = (what: string) => problems.push(`${name}: ${what}`);
    const facts = await documentFacts(page);
    if (facts.lang !== 'en') say(`lang is "${facts.lang}"`);
    if (!facts.title.trim()) say('no title');
    if (facts.h1 !== 1) say(`${facts.h1} h1`);
    if (facts.dupIds.length) say(`duplicate ids ${facts.dupIds.join(', ')}`);
    for (const control of await axControls(page)) {
      if (!control.name.trim()) say(`a ${control.role} with no name`);
    }
    for (const failure of await contrastFailures(page)) {
      say(`contrast ${failure.ratio}:1 < ${failure.needed}:1 for "${failure.text}"`);
    }
    for (const loss of await textSpacingLosses(page)) say(`text spacing: ${loss}`);
    const size = page.viewportSize() ?? { width: 1000, height: 700 };
    await page.setViewportSize({ width: 320, height: 640 });
    const overflow = await sidewaysOverflow(page);
    const outsideTables = await page.evaluate(() => {
      const width = document.documentElement.clientWidth;
      return Array.from(document.body.querySelectorAll('*')).filter(
        (element) => !element.closest('table') && element.getBoundingClientRect().right > width + 0.5,
      ).length;
    });
    if (outsideTables > 0) say(`scrolls sideways at 320 px by ${overflow.by}: ${overflow.culprits.join('; ')}`);
    await page.setViewportSize(size);
    // The focus order is the reading order: the controls in document order.
    const inDocumentOrder = await page.evaluate(
      (selector) =>
        Array.from(document.querySelectorAll(selector)).map((element) => {
          const label = element.id ? document.querySelector(`label[for="${element.id}"]`)?.textContent : undefined;
          return `${element.tagName.toLowerCase()}:${(label ?? element.textContent ?? '').trim()}`;
        }),
      focusable,
    );
    const stops = await tabStops(page);
    if (JSON.stringify(stops) !== JSON.stringify(inDocumentOrder)) {
      say(`tab order ${stops.join(' > ')} is not ${inDocumentOrder.join(' > ')}`);
    }
    const controls = page.locator(focusable);
    for (let i = 0; i < (await controls.count()); i++) {
      const indicator = await focusIndicator(page, controls.nth(i));
      // A ring of a few pixels around a control changes well over 50 of them.
      if (indicator.changed < 50 || indicator.contrast < 3) {
        say(`focus of ${inDocumentOrder[i]} barely visible (${indicator.changed} px, ${indicator.contrast}:1)`);
      }
    }
    return problems;
  }

  /** Serves `html` at `url` with the headers every page carries (its CSP allows our style by hash). */
  async function serve(page: Page, url: string, html: string): Promise<void> {
    await page.route(url, (route) => route.fulfill({ status: 200, headers: { ...pageHeaders }, body: html }));
    await page.goto(url);
  }

  it('pins: every page has lang, a title, one h1, named controls, contrast, reflow, text spacing, order and focus', async () => {
    const context = await newContext();
    const page = await context.newPage();
    const problems: string[] = [];
    const check = async (name: string) => problems.push(...(await problemsOf(page, name)));
    const { appUrl, authUrl } = whole.running;

    await page.goto(appUrl);
    await check('app signed out');
    await page.getByRole('link', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Sign in' }).waitFor();
    await check('login');
    const login = await axControls(page);
    expect(login.find((control) => control.name === 'Username')?.autocomplete).toBe('username');
    expect(login.find((control) => control.name === 'Password')?.autocomplete).toBe('current-password');
    await page.getByLabel('Username').fill('alice');
    await page.getByLabel('Password').fill('not her password');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('alert').waitFor();
    await check('login error');
    await page.getByLabel('Password').fill(alice?.password ?? '');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Allow access' }).waitFor();
    await check('consent');
    await page.getByRole('button', { name: 'Allow' }).click();
    await page.locator('#user-name').waitFor();
    await check('home');
    await page.getByRole('button', { name: 'Create charge' }).click();
    await page.locator('#flash').waitFor();
    await check('home after a charge');
    await page.getByRole('combobox', { name: 'Theme' }).selectOption('dark');
    await page.getByRole('button', { name: 'Save theme' }).click();
    await page.locator('#flash').waitFor();
    await check('home, dark');
    await page.goto(`${appUrl}/signin`);
    await check('sign in again');
    await page.goto(`${appUrl}/no-such-page`);
    await check('app 404');
    await whole.stack.api.relayOnce();
    await page.goto(whole.stack.receiver.pageUrl);
    await page.locator('tbody tr').first().waitFor();
    await check('receiver');
    await page.goto(`${authUrl}/no-such-page`);
    await check('provider 404');
    await page.goto(`${authUrl}/interaction/no-such-interaction`);
    await check('interaction expired');
    await page.goto(`${authUrl}/auth?client_id=no-such-client&response_type=code`);
    await check('provider error');
    await page.goto(appUrl);
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByRole('button', { name: 'Yes, sign me out' }).waitFor();
    await check('sign out');
    await page.getByRole('button', { name: 'Yes, sign me out' }).click();
    await page.getByText('You are signed out.').waitFor();
    await check('app signed out, with its status');
    await page.goto(`${authUrl}/session/end`);
    await check('sign out, not signed in');
    await page.getByRole('button', { name: 'Continue' }).click();
    await page.getByRole('heading', { name: 'Signed out' }).waitFor();
    await check('provider signed out');
    await page.goto(appUrl);
    await page.getByRole('link', { name: 'Sign in' }).click();
    await page.getByRole('button', { name: 'Cancel' }).click();
    await page.getByRole('heading', { name: 'Sign-in failed' }).waitFor();
    await check('sign-in cancelled');
    // The steps the browser test reaches through a native client, here on their own.
    await serve(
      page,
      `${authUrl}/a11y/switch`,
      switchAccountPage({
        action: '/session/end/confirm',
        xsrf: 'x',
        currentName: 'Alice Liddell',
        nextName: 'Bob Builder',
        clientName: 'Photo app',
      }),
    );
    await check('switch account');
    await serve(
      page,
      `${authUrl}/a11y/form-post`,
      formPostPage({ action: 'http://127.0.0.1:1/callback', fields: [['code', 'c']], clientName: 'Photo app' }),
    );
    await check('form_post');
    await context.close();
    expect(problems).toEqual([]);
  }, 120_000);

  it('pins: signs in, consents, sets the theme, charges and signs out by keyboard alone', async () => {
    const context = await newContext();
    const page = await context.newPage();
    const press = async (...keys: string[]) => {
      for (const key of keys) await page.keyboard.press(key);
    };
    await page.goto(whole.running.appUrl);
    await press('Tab', 'Enter');
    // The cursor starts in the username field.
    await page.getByRole('heading', { name: 'Sign in' }).waitFor();
    await page.keyboard.type('alice');
    await press('Tab');
    await page.keyboard.type(alice?.password ?? '');
    await press('Enter');
    await page.getByRole('heading', { name: 'Allow access' }).waitFor();
    await press('Tab', 'Space');
    await page.locator('#user-name').waitFor();
    // Sign out, Theme (Arrow Down: dark), Save theme.
    await press('Tab', 'Tab', 'ArrowDown', 'Tab', 'Enter');
    await page.locator('#flash').waitFor();
    expect(await page.locator('#flash').locator('..').textContent()).toContain('Theme set to dark.');
    // Sign out, Theme, Save theme, Amount.
    await press('Tab', 'Tab', 'Tab', 'Tab', 'Control+a');
    await page.keyboard.type('6101');
    await press('Enter');
    await page.locator('#flash').waitFor();
    expect(await page.locator('#flash').locator('..').textContent()).toContain('Charge created.');
    const { rows } = await whole.db.query<{ n: number }>(
      'select count(*)::int as n from api_charges where amount = 6101',
    );
    expect(rows[0]?.n).toBe(1);
    await press('Tab', 'Enter');
    await page.getByRole('heading', { name: 'Sign out?' }).waitFor();
    await press('Tab', 'Space');
    await page.getByText('You are signed out.').waitFor();
    await context.close();
  });

  /** A new tab of `context` signed in as alice. */
  async function signIn(context: BrowserContext): Promise<Page> {
    const page = await context.newPage();
    await page.goto(whole.running.appUrl);
    await page.getByRole('link', { name: 'Sign in' }).click();
    await page.getByLabel('Username').fill('alice');
    await page.getByLabel('Password').fill(alice?.password ?? '');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('button', { name: 'Allow' }).click();
    await page.locator('#user-name').waitFor();
    return page;
  }

  // Was a defect: after a wrong password the login page puts the cursor in the password field, but
  // the message saying what went wrong ("Invalid username or password") is tied to no field: a
  // screen reader announces "Password, edit text, required" and nothing else, and the person types
  // again without knowing the first attempt failed (WCAG 3.3.1, 4.1.2). Expected: the focused field's
  // accessible description is the message.
  it('reads the sign-in error with the field that has the focus after a wrong password', async () => {
    const context = await newContext();
    const page = await context.newPage();
    await page.goto(whole.running.appUrl);
    await page.getByRole('link', { name: 'Sign in' }).click();
    await page.getByLabel('Username').fill('alice');
    await page.getByLabel('Password').fill('not her password');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('alert').waitFor();
    const focused = (await axControls(page)).find((control) => control.focused);
    expect(focused?.name).toBe('Password');
    expect(focused?.description).toBe(invalidLoginMessage);
    // The username, one Shift+Tab away, says it too: either may be the wrong one.
    const username = (await axControls(page)).find((control) => control.name === 'Username');
    expect(username?.description).toBe(invalidLoginMessage);
    await context.close();
  });

  // Was a defect: with the dark theme saved, an API section that failed ("API unavailable", "The API
  // refused") shows its message in the light theme's dark red (#a00) on the dark background
  // (#1d1f21): a contrast of 2.1:1, where normal text needs 4.5:1 (WCAG 1.4.3). Expected: every text
  // of the dark page readable.
  it('shows the API errors of the dark theme with readable contrast', async () => {
    const context = await newContext();
    const page = await context.newPage();
    const headers = new Headers();
    await serve(
      page,
      `${whole.running.appUrl}/a11y/dark-errors`,
      homePage({
        user: { sub: 'user-alice', name: 'Alice Liddell' },
        csrf: 'x',
        chargeKey: 'k',
        photos: { kind: 'unavailable', reason: 'ECONNREFUSED' },
        stock: { kind: 'refused', status: 403, title: 'Forbidden', body: null, headers },
        settings: { kind: 'ok', status: 200, body: { theme: 'dark' }, headers },
      }),
    );
    expect(await page.locator('.theme-dark .error').count()).toBe(2);
    // The stylesheet applies (the CSP allows it by its hash): the errors sit on the dark background.
    const dark = await page.locator('.theme-dark').evaluate((element) => getComputedStyle(element).backgroundColor);
    expect(dark).toBe('rgb(29, 31, 33)');
    expect(await contrastFailures(page)).toEqual([]);
    await context.close();
  });

  // Was a defect: a charge, theme or sign-out form the app refuses (the CSRF check) or cannot read (too
  // large: 413, an unknown charset: 415) lands on a page whose title and heading say "Sign-in failed":
  // a screen reader user hears the title first, and thinks they were signed out or their sign-in broke,
  // while nobody was signing in (WCAG 2.4.2, 2.4.6). Expected: the title and heading say what happened.
  it('names a refused or unreadable form for what happened, not "Sign-in failed"', async () => {
    const context = await newContext();
    const page = await signIn(context);
    await page.locator('form[action="/charges"] input[name="csrf"]').evaluate((input) => {
      (input as HTMLInputElement).value = 'not the token';
    });
    await page.getByRole('button', { name: 'Create charge' }).click();
    await page.locator('h1').waitFor();
    expect(await page.title()).toBe('Request refused');
    expect(await page.locator('h1').textContent()).toBe('Request refused');
    // The way on is still there.
    expect(await page.getByRole('link', { name: 'Back' }).count()).toBe(1);

    for (const [status, contentType, body] of [
      [413, 'application/x-www-form-urlencoded', `amount=${'1'.repeat(200_000)}`],
      [415, 'application/x-www-form-urlencoded; charset=koi8-r', 'amount=1'],
    ] as const) {
      const response = await fetch(`${whole.running.appUrl}/charges`, {
        method: 'POST',
        headers: { 'content-type': contentType },
        body,
      });
      expect(response.status).toBe(status);
      const html = await response.text();
      expect(html).toContain('<title>Form not read</title>');
      expect(html).toContain('<h1>Form not read</h1>');
    }
    await context.close();
  });

  // Was a defect: at 320 CSS px (a phone, or 400% zoom) a page scrolls sideways as soon as it shows one
  // long word: an email address, a subject, or the API's URL in a consent heading
  // ("At https://api.payments.example.com"). Only list items and table cells could break a word;
  // paragraphs and headings could not (WCAG 1.4.10 Reflow). Expected: no page scrolls sideways.
  it('reflows long addresses, subjects and resource URLs at 320 px without scrolling sideways', async () => {
    const context = await browser.newContext({ viewport: { width: 320, height: 640 } });
    const page = await context.newPage();
    const headers = new Headers();
    const pages: Array<[string, string]> = [
      [
        'home',
        homePage({
          user: {
            sub: 'oauth2|googleapis|112233445566778899001122',
            name: 'Alice Liddell',
            email: 'alice.pleasance.liddell@wonderlanduniversity.example',
          },
          csrf: 'x',
          chargeKey: 'k',
          photos: { kind: 'ok', status: 200, body: { photos: [] }, headers },
          stock: { kind: 'ok', status: 200, body: {}, headers },
          settings: { kind: 'ok', status: 200, body: { theme: 'light' }, headers },
        }),
      ],
      [
        'consent',
        consentPage({
          uid: 'u',
          csrf: 'x',
          clientName: 'Photo app',
          userName: 'Alice Liddell',
          scopes: ['openid'],
          resources: [{ resource: 'https://api.payments.wonderland.example', scopes: ['photos:read'] }],
        }),
      ],
    ];
    const overflows: string[] = [];
    for (const [name, html] of pages) {
      await serve(page, `${whole.running.appUrl}/a11y/reflow-${name}`, html);
      const overflow = await sidewaysOverflow(page);
      if (overflow.by > 0) overflows.push(`${name}: ${overflow.by} px (${overflow.culprits.join('; ')})`);
    }
    await context.close();
    expect(overflows).toEqual([]);
  });

  // Was wrong: the webhook receiver's page reloaded itself every 5 seconds (`<meta http-equiv="refresh">`)
  // and offered no way to stop it. Each reload sends a screen reader back to the top of the page and
  // reads it again, so a person could not get through the table of events (WCAG 2.2.1 Timing
  // Adjustable, failure F41). A "Stop refreshing" link now comes first; the page it leads to does
  // not reload, and links back.
  it('lets a person stop the webhook receiver page from reloading itself', async () => {
    const context = await newContext();
    const page = await context.newPage();
    await page.goto(whole.stack.receiver.pageUrl);
    const refreshes = await page.locator('meta[http-equiv="refresh" i]').count();
    const stop = page.getByRole('link', { name: /stop|pause/i });
    expect(refreshes === 0 || (await stop.count()) === 1).toBe(true);
    if (refreshes > 0) {
      await stop.click();
      await page.waitForLoadState();
      expect(await page.locator('meta[http-equiv="refresh" i]').count()).toBe(0);
      expect(await page.getByRole('heading', { level: 1 }).textContent()).toBe('Webhook receiver');
      expect(await page.getByRole('link', { name: 'Refresh every 5 seconds' }).count()).toBe(1);
    }
    await context.close();
  });
});
