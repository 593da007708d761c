import { mkdir, mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type BrowserContext, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { sendOnceScript } from '../src/html.js';
import { listen } from '../src/listen.js';
import { demoUsers } from '../src/seed.js';
import type { RunningReferenceApp } from '../src/start.js';
import { chromiumOptions, hasChromium } from './chromium.js';
import { startWholeStack, type WholeStack } from './test-stack.js';

const screenshotDir = fileURLToPath(new URL('../../../docs/walkthrough/', import.meta.url));
const updateScreenshots = process.env.UPDATE_SCREENSHOTS === '1';
const alice = demoUsers.find((user) => user.username === 'alice');

describe.runIf(hasChromium)('a new user in a real browser', () => {
  let whole: WholeStack;
  let db: Database;
  let running: RunningReferenceApp;
  let stack: RunningResourceStack;
  let context: BrowserContext;
  let page: Page;
  let userDataDir: string;

  beforeAll(async () => {
    // The test drives the outbox itself, so the moment of delivery is part of the story it checks.
    whole = await startWholeStack('browser');
    ({ db, running, stack } = whole);
    userDataDir = await mkdtemp(join(tmpdir(), 'idem-browser-'));
    context = await chromium.launchPersistentContext(userDataDir, {
      ...chromiumOptions,
      viewport: { width: 1000, height: 700 },
    });
    page = context.pages()[0] ?? (await context.newPage());
    if (updateScreenshots) await mkdir(screenshotDir, { recursive: true });
  }, 120_000);

  afterAll(async () => {
    await context?.close();
    if (userDataDir) await rm(userDataDir, { recursive: true, force: true });
    await whole?.close();
  });

  async function shot(name: string): Promise<void> {
    if (!updateScreenshots) return;
    const path = join(screenshotDir, `${name}.png`);
    await page.screenshot({ path, fullPage: false });
    // Screenshots live in the repository: keep them small enough to review.
    expect((await stat(path)).size).toBeLessThan(150 * 1024);
  }

  it('signs in as alice at the identity provider and consents', async () => {
    await page.goto(running.appUrl);
    await expect(page.getByRole('heading', { level: 1 }).textContent()).resolves.toBe('Photo app');
    await shot('01-photo-app-signed-out');

    await page.getByRole('link', { name: 'Sign in' }).click();
    await page.waitForURL((url) => url.href.startsWith(running.authUrl));
    await expect(page.getByRole('heading', { level: 1 }).textContent()).resolves.toBe('Sign in');
    await page.getByLabel('Username').fill('alice');
    await page.getByLabel('Password').fill(alice?.password ?? '');
    await shot('02-identity-provider-login');
    await page.getByRole('button', { name: 'Sign in' }).click();

    await page.getByRole('heading', { name: 'Allow access' }).waitFor();
    await shot('03-identity-provider-consent');
    await page.getByRole('button', { name: 'Allow' }).click();

    await page.waitForURL((url) => url.href.startsWith(running.appUrl));
    await expect(page.locator('#user-name').textContent()).resolves.toBe(alice?.name);
  });

  it("shows alice's photos and none of bob's", async () => {
    const photos = (await page.locator('section[aria-labelledby="photos"]').textContent()) ?? '';
    expect(photos).toContain('photo-alice-1');
    expect(photos).toContain('Tea party');
    expect(photos).not.toContain('photo-bob');
    expect(photos).not.toContain('Scaffolding');
    await shot('04-photo-app-signed-in');
  });

  it('switches the theme to dark (PUT /settings)', async () => {
    await page.getByRole('combobox', { name: 'Theme' }).selectOption('dark');
    await page.getByRole('button', { name: 'Save theme' }).click();
    await page.locator('section[aria-labelledby="flash"]').waitFor();
    const flash = (await page.locator('section[aria-labelledby="flash"]').textContent()) ?? '';
    expect(flash).toContain('Theme set to dark.');
    expect(await page.locator('section[aria-labelledby="settings"] pre').textContent()).toContain('"theme": "dark"');
    expect(await page.locator('.theme-dark').count()).toBe(1);
    await shot('05-theme-dark');
  });

  let chargeId = '';

  it('creates a charge and sees its key, the attempts and that it was not a replay', async () => {
    await page.getByRole('spinbutton', { name: 'Amount' }).fill('4200');
    await page.getByRole('textbox', { name: 'Currency', exact: true }).fill('EUR');
    await page.getByRole('button', { name: 'Create charge' }).click();
    const flash = page.locator('section[aria-labelledby="flash"]');
    await flash.waitFor();
    const text = (await flash.textContent()) ?? '';
    expect(text).toContain('Charge created.');
    expect(text).toMatch(/Idempotency-Key: \S+/);
    expect(text).toContain('Attempts: 1');
    expect(text).toContain('Replayed: no');
    chargeId = /"id":"(ch_[^"]+)"/.exec(text)?.[1] ?? '';
    expect(chargeId).toMatch(/^ch_/);
    const { rows } = await db.query<{ amount: number }>('select amount from api_charges where id = $1', [chargeId]);
    expect(rows).toEqual([{ amount: 4200 }]);
    await shot('06-charge-created');
  });

  it('sends the same charge again with the same key and gets the stored answer: a replay, no second charge', async () => {
    const flash = page.locator('section[aria-labelledby="flash"]');
    const key = await flash.locator('input[name="key"]').inputValue();
    expect(key).toMatch(/^[0-9a-f-]{36}$/);
    await page.getByRole('button', { name: 'Send the same charge again (same key)' }).click();
    await page.getByText('Replayed: yes').waitFor();
    const text = (await flash.textContent()) ?? '';
    expect(await flash.getByText(`Idempotency-Key: ${key}`).count()).toBe(1);
    expect(text).toContain(`"id":"${chargeId}"`);
    expect(text).toContain('Status 201');
    const { rows } = await db.query<{ id: string }>('select id from api_charges where idempotency_key = $1', [key]);
    expect(rows).toEqual([{ id: chargeId }]);
    await shot('07-charge-replayed');
  });

  it('sees the payment.succeeded webhook on the receiver page, applied once', async () => {
    const round = await stack.api.relayOnce();
    expect(round.delivered).toBeGreaterThanOrEqual(1);
    await page.goto(stack.receiver.pageUrl);
    const row = page.locator(`tr[data-event-id="evt_${chargeId}"]`);
    await expect(row.locator('td.deliveries').textContent()).resolves.toBe('1');
    await expect(row.locator('td.applied').textContent()).resolves.toBe('once');
    expect(await row.textContent()).toContain('payment.succeeded');
    await shot('08-webhook-receiver');
  });

  // Two steps the identity provider answers with a page of oidc-provider's own unless the app replaces
  // it: the account switch and the form_post response. A native tool (the public client, any loopback
  // port) stands in for the client; a small server records what reaches its redirect URI.
  describe("the provider's own steps, on our pages", () => {
    const bob = demoUsers.find((user) => user.username === 'bob');
    const received: Array<{ method: string; query: URLSearchParams; body: URLSearchParams }> = [];
    let tool: Awaited<ReturnType<typeof listen>>;
    const redirectUri = () => `http://127.0.0.1:${tool.port}/callback`;
    const authorize = (extra: Record<string, string>) => {
      const url = new URL('/auth', running.authUrl);
      const params = {
        client_id: running.clients.publicClient.clientId,
        redirect_uri: redirectUri(),
        response_type: 'code',
        scope: 'openid profile',
        state: 'tool-state',
        code_challenge: 'E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM',
        code_challenge_method: 'S256',
        ...extra,
      };
      for (const [name, value] of Object.entries(params)) url.searchParams.set(name, value);
      return url.href;
    };
    /**
     * The scripts of a page of this step besides the one every page has (a form is sent once), which
     * the CSP allows by its hash: ours have no other, and the CSP allows no other.
     */
    const scripts = async () =>
      (await page.locator('script').allTextContents()).filter((text) => text !== sendOnceScript).length;

    beforeAll(async () => {
      tool = await listen(0);
      tool.use((req, res) => {
        let body = '';
        req.on('data', (chunk) => {
          body += chunk;
        });
        req.on('end', () => {
          // Only the redirect URI counts (the browser asks for /favicon.ico too).
          if (!req.url?.startsWith('/callback')) {
            res.writeHead(404).end();
            return;
          }
          received.push({
            method: req.method ?? '',
            query: new URL(req.url ?? '/', redirectUri()).searchParams,
            body: new URLSearchParams(body),
          });
          res.writeHead(200, { 'content-type': 'text/plain' }).end('signed in');
        });
      });
    });

    afterAll(async () => {
      await tool?.close();
    });

    it('asks alice, still signed in, before bob signs in instead (prompt=login)', async () => {
      await page.goto(authorize({ prompt: 'login consent' }));
      await expect(page.getByRole('heading', { level: 1 }).textContent()).resolves.toBe('Sign in');
      await page.getByLabel('Username').fill('bob');
      await page.getByLabel('Password').fill(bob?.password ?? '');
      await page.getByRole('button', { name: 'Sign in' }).click();

      await page.getByRole('heading', { name: 'Switch account' }).waitFor();
      expect(await page.locator('main').textContent()).toContain(`You are signed in as ${alice?.name}`);
      expect(await scripts()).toBe(0);
      await page.getByRole('button', { name: `Continue as ${bob?.name}` }).click();

      await page.getByRole('heading', { name: 'Allow access' }).waitFor();
      expect(await page.locator('main').textContent()).toContain(`Signed in as ${bob?.name}`);
      await page.getByRole('button', { name: 'Allow' }).click();
      await page.waitForURL((url) => url.href.startsWith(redirectUri()));
      const last = received.at(-1);
      expect(last?.method).toBe('GET');
      expect(last?.query.get('code')).toEqual(expect.any(String));
      expect(last?.query.get('state')).toBe('tool-state');
    });

    it('posts a form_post response to the client from our page, on a click', async () => {
      // bob is signed in: the provider asks for his consent again (a native client always gets asked),
      // then answers with the code in a form for the client.
      await page.goto(authorize({ prompt: 'consent', response_mode: 'form_post' }));
      await page.getByRole('heading', { name: 'Allow access' }).waitFor();
      await page.getByRole('button', { name: 'Allow' }).click();
      await page.getByRole('heading', { name: 'Back to the application' }).waitFor();
      expect(await scripts()).toBe(0);
      await page.getByRole('button', { name: 'Continue' }).click();
      await page.waitForURL((url) => url.href.startsWith(redirectUri()));
      const last = received.at(-1);
      expect(last?.method).toBe('POST');
      expect(last?.body.get('code')).toEqual(expect.any(String));
      expect(last?.body.get('state')).toBe('tool-state');
      expect(last?.body.get('iss')).toBe(running.authUrl);
    });
  });
});
