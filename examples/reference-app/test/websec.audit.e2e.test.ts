// A browser attacker against the reference app: pages of another site that link, post or frame
// into the identity provider and the third-party app, and what the victim's browser then shows.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { type Browser, chromium } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromiumOptions, hasChromium } from './chromium.js';
import { startWholeStack, type WholeStack } from './test-stack.js';
import { pkcePair } from './user-agent.js';

describe.runIf(hasChromium)('the reference app against pages of another site', () => {
  let whole: WholeStack;
  let browser: Browser;
  // The attacker's site: 127.0.0.1 is another site than the app's and the provider's localhost.
  let attacker: Server;
  let attackerUrl: string;
  let attackerPage = '';

  beforeAll(async () => {
    whole = await startWholeStack('websec_audit');
    attacker = createServer((_req, res) => {
      res.setHeader('Content-Type', 'text/html; charset=utf-8');
      res.end(attackerPage);
    });
    await new Promise<void>((resolve) => attacker.listen(0, '127.0.0.1', resolve));
    attackerUrl = `http://127.0.0.1:${(attacker.address() as AddressInfo).port}/`;
    browser = await chromium.launch(chromiumOptions);
  }, 120_000);

  afterAll(async () => {
    await browser?.close();
    await new Promise((resolve) => attacker?.close(resolve));
    await whole?.close();
  });

  /** The visible text of the page the victim lands on after clicking the attacker's one link. */
  async function followAttackerLink(href: string): Promise<string> {
    attackerPage = `<!doctype html><a id="go" href="${href.replaceAll('&', '&amp;').replaceAll('"', '&quot;')}">Claim your prize</a>`;
    const context = await browser.newContext();
    try {
      const page = await context.newPage();
      await page.goto(attackerUrl);
      await page.click('#go');
      await page.waitForURL((url) => url.origin === new URL(whole.running.authUrl).origin);
      return ((await page.locator('main').textContent()) ?? '').replace(/\s+/g, ' ');
    } finally {
      await context.close();
    }
  }

  // The provider must not redirect to a redirect_uri the client did not register (RFC 6749 4.1.2.1), so
  // it shows an error page on its own origin instead. Whatever the link put in `state` (the client's
  // value, meaningless to the person) then read as the provider speaking: "call this number", "your
  // account is locked, sign in at ...".
  it.each([
    ['a redirect_uri the client never registered', { redirect_uri: 'https://evil.example/cb' }],
    ['an unknown client', { client_id: 'no-such-client' }],
  ])("shows none of the link's own text on the provider's error page for %s", async (_name, change) => {
    const bait = 'Your account is locked. Call +1 555 0100 to unlock it';
    const params = new URLSearchParams({
      client_id: whole.running.clients.app.clientId,
      redirect_uri: whole.running.clients.app.redirectUri,
      response_type: 'code',
      scope: 'openid',
      code_challenge: pkcePair().challenge,
      code_challenge_method: 'S256',
      state: bait,
      ...change,
    });
    const text = await followAttackerLink(`${whole.running.authUrl}/auth?${params}`);
    expect(text).toContain('Sign-in error');
    expect(text).not.toContain(bait);
  });
  // README: "every other page a browser can get from the provider ... Each replaces oidc-provider's
  // own ... Content-Security-Policy ... X-Frame-Options: DENY". The provider's address itself, typed
  // into the address bar, or a mistyped path, is such a page too; the third-party app answers those
  // with its 404 page and these headers.
  it.each([
    ['/', 'the provider', () => whole.running.authUrl],
    ['/no-such-page', 'the provider', () => whole.running.authUrl],
    ['/no-such-page', 'the app (the contrast)', () => whole.running.appUrl],
  ])("answers a browser at %s of %s with a page carrying every page's headers", async (path, _name, origin) => {
    const context = await browser.newContext();
    try {
      const page = await context.newPage();
      const response = await page.goto(new URL(path, origin()).href);
      const headers = response?.headers() ?? {};
      expect(response?.status()).toBe(404);
      expect({
        type: headers['content-type'],
        frameAncestors: /frame-ancestors 'none'/.test(headers['content-security-policy'] ?? ''),
        frameOptions: headers['x-frame-options'],
        nosniff: headers['x-content-type-options'],
        referrer: headers['referrer-policy'],
      }).toEqual({
        type: 'text/html; charset=utf-8',
        frameAncestors: true,
        frameOptions: 'DENY',
        nosniff: 'nosniff',
        referrer: 'no-referrer',
      });
      await expect(page.locator('html').getAttribute('lang')).resolves.toBe('en');
    } finally {
      await context.close();
    }
  });
});
