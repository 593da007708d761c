// The 12 hours of a password (OWASP ASVS 3.3.2 level 2) in a real browser: a sign-in that reuses the
// provider's session, without the password, keeps the app only until 12 hours after the password,
// and the next "Sign in" asks for it. The database's clock cannot be moved: the rows are aged.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type BrowserContext, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { demoUsers } from '../src/seed.js';
import { chromiumOptions, hasChromium } from './chromium.js';
import { startWholeStack, type WholeStack } from './test-stack.js';

const alice = demoUsers.find((user) => user.username === 'alice');

describe.runIf(hasChromium)('a password 12 hours old, in a real browser', () => {
  let whole: WholeStack;
  let context: BrowserContext;
  let page: Page;
  let userDataDir: string;

  beforeAll(async () => {
    whole = await startWholeStack('sign_in_lifetime_e2e');
    userDataDir = await mkdtemp(join(tmpdir(), 'idem-sign-in-lifetime-'));
    context = await chromium.launchPersistentContext(userDataDir, chromiumOptions);
    page = context.pages()[0] ?? (await context.newPage());
  }, 120_000);

  afterAll(async () => {
    await context?.close();
    if (userDataDir) await rm(userDataDir, { recursive: true, force: true });
    await whole?.close();
  });

  const signInLink = () => page.getByRole('link', { name: 'Sign in' });
  const heading = () => page.getByRole('heading', { level: 1 }).textContent();
  /** Presses "Sign in" on the signed-out page; returns the first page of the provider's it lands on. */
  const pressSignIn = async () => {
    await signInLink().click();
    await page.waitForURL((url) => url.href.startsWith(whole.running.authUrl));
    return heading();
  };
  const allow = async () => {
    await page.getByRole('button', { name: 'Allow' }).click();
    await page.waitForURL((url) => url.href.startsWith(whole.running.appUrl));
  };

  it('keeps the app only until 12 hours after the password, then asks for it', async () => {
    await page.goto(whole.running.appUrl);
    await expect(pressSignIn()).resolves.toBe('Sign in');
    await page.getByLabel('Username').fill('alice');
    await page.getByLabel('Password').fill(alice?.password ?? '');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Allow access' }).waitFor();
    await allow();
    await expect(page.locator('#user-name').textContent()).resolves.toBe(alice?.name);

    // 11 h 58 min later: the app's session has ended (here: it is deleted), the provider's has not.
    await whole.db.query(
      `update idp_models set payload = jsonb_set(payload, '{loginTs}', to_jsonb(extract(epoch from now())::bigint - $1::bigint))
        where model = 'Session' and payload ? 'loginTs'`,
      [12 * 3600 - 120],
    );
    await whole.db.query('delete from app_sessions');
    await page.goto(whole.running.appUrl);
    // "Sign in" again: no password, the provider's session is reused.
    await expect(pressSignIn()).resolves.toBe('Allow access');
    await allow();
    await expect(page.locator('#user-name').textContent()).resolves.toBe(alice?.name);

    // Three minutes on, the password is 12 h 1 min old: the app has signed alice out ...
    await whole.db.query(
      `update app_sessions set created_at = created_at - interval '3 minutes', expires_at = expires_at - interval '3 minutes',
          data = jsonb_set(data, '{authTime}', to_jsonb((data ->> 'authTime')::bigint - 180))
        where data ? 'authTime'`,
    );
    await whole.db.query(
      `update idp_models set payload = jsonb_set(payload, '{loginTs}', to_jsonb((payload ->> 'loginTs')::bigint - 180))
        where model = 'Session' and payload ? 'loginTs'`,
    );
    await page.reload();
    await expect(signInLink().isVisible()).resolves.toBe(true);
    // ... and the provider asks for the password.
    await expect(pressSignIn()).resolves.toBe('Sign in');
  });
});
