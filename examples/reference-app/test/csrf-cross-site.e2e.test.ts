import { type Browser, chromium, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { demoUsers } from '../src/seed.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { chromiumOptions, hasChromium } from './chromium.js';
import { freePort } from './ports.js';
import { openTestDatabase } from './services.js';

const alice = demoUsers.find((user) => user.username === 'alice');

describe.runIf(hasChromium)('sign-in forms when the app and the provider are on different sites', () => {
  let db: Database;
  let running: RunningReferenceApp;
  let browser: Browser;

  beforeAll(async () => {
    db = await openTestDatabase('csrf_sites');
    const authPort = await freePort();
    running = await startReferenceApp({
      db,
      authPort,
      authUrl: `http://127.0.0.1:${authPort}`,
      appPort: 0,
      baseUrl: 'http://localhost:8080',
    });
    browser = await chromium.launch(chromiumOptions);
  }, 120_000);

  afterAll(async () => {
    await browser?.close();
    await running?.close();
    await db?.close();
  });

  async function toLoginPage(page: Page): Promise<void> {
    await page.goto(running.appUrl);
    await page.getByRole('link', { name: 'Sign in' }).click();
    await page.waitForURL((url) => url.href.startsWith(running.authUrl));
    await expect(page.getByRole('heading', { level: 1 }).textContent()).resolves.toBe('Sign in');
  }

  it('lets the first of two sign-in tabs log in after the second one opened', async () => {
    expect(new URL(running.appUrl).hostname).not.toBe(new URL(running.authUrl).hostname);
    const context = await browser.newContext();
    const first = await context.newPage();
    const second = await context.newPage();
    await toLoginPage(first);
    await toLoginPage(second);

    await first.getByLabel('Username').fill('alice');
    await first.getByLabel('Password').fill(alice?.password ?? '');
    const answer = first.waitForResponse((response) => response.request().method() === 'POST');
    await first.getByRole('button', { name: 'Sign in' }).click();
    expect((await answer).status()).not.toBe(403);
    await first.getByRole('heading', { name: 'Allow access' }).waitFor();
    await context.close();
  });
});
