// A client secret rotated at the provider only refuses every session's refresh, at every request that
// finds its token due: by default (no `onEvent`) the app tells the operator on stderr, the first
// refusal at once, then at most one line a minute with how many of each code came in, as the
// receiver does for refused webhook deliveries. One line per request would bury the log.
//
// The whole stack on the embedded PGlite: the provider, and two app processes, the second holding a
// client secret the provider does not know (oidc-provider refuses it: 401 invalid_client).
import { format } from 'node:util';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { Database } from '../src/db.js';
import { rotateSecret } from '../src/rotate-secrets.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { loginAndConsent } from './flow.js';
import { openTestDatabase } from './services.js';
import { alice } from './test-idp.js';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { createUserAgent } from './user-agent.js';

describe('the default report of refused refreshes', () => {
  let stack: TwoAppStack;
  /** The apps' clock, ahead of the real one by this much. */
  let clock = 0;
  /** Token requests that reached the provider (refreshes, once signed in). */
  let tokenRequests = 0;

  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'refresh_refused_log',
      embedded: true,
      now: () => Date.now() + clock,
      authMiddleware: (provider) => (req, res) => {
        if (req.method === 'POST' && req.url?.split('?')[0] === '/token') tokenRequests++;
        provider(req, res);
      },
      app: (i, seeded) => (i === 1 ? { clientSecret: `${seeded.clientSecret}-before-the-rotation` } : {}),
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
  });

  it('writes the first refusal at once, then one line a minute with how many came in', async () => {
    const { cookie, tokens } = await stack.signIn();
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => undefined);
    try {
      clock = 301_000;
      tokenRequests = 0;
      const refusals = () => warn.mock.calls.map((args) => format(...args)).filter((line) => line.includes('refused'));
      for (let i = 0; i < 5; i++) expect((await stack.page(1, cookie)).body).toContain('Alice');
      // Each page load asked the provider once, and each was refused.
      expect(tokenRequests).toBe(5);
      expect(refusals()).toHaveLength(1);
      expect(refusals()[0]).toContain('invalid_client');
      expect(refusals()[0]).toContain("is the app's client secret the provider's?");
      // A minute later by the app's clock, the next refusal brings the line of those since, counted.
      clock += 60_000;
      expect((await stack.page(1, cookie)).body).toContain('Alice');
      expect(refusals()).toHaveLength(2);
      expect(refusals()[1]).toMatch(/refused 5 refreshes \(invalid_client 5; the last HTTP 401/);
      for (const line of refusals()) {
        expect(line).not.toContain('\n');
        for (const secret of [tokens.refreshToken!, tokens.accessToken, stack.client.clientSecret])
          expect(line).not.toContain(secret);
      }
    } finally {
      warn.mockRestore();
      clock = 0;
    }
  });
});

// The counted line of the last minute waits for a timer (unref'd: it keeps no process alive). A
// shutdown writes it once the app's requests are done, as the receiver does with its refused
// deliveries: the refusals of the app's last minute are told too.
describe('the default report of refused refreshes at shutdown', () => {
  let db: Database;
  let running: RunningReferenceApp | undefined;
  let clock = 0;

  beforeAll(async () => {
    db = await openTestDatabase('refused_log_close', { embedded: true });
    // No API behind it: the page says "API unavailable" and still shows who is signed in.
    running = await startReferenceApp({
      db,
      authPort: 0,
      appPort: 0,
      baseUrl: 'http://127.0.0.1:1',
      now: () => Date.now() + clock,
    });
  }, 120_000);

  afterAll(async () => {
    await running?.close();
    await db?.close();
  });

  it('writes the refusals counted since the last line when the app closes', async () => {
    const app = running!;
    const agent = createUserAgent();
    const callback = await loginAndConsent(
      agent,
      app.authUrl,
      new URL('/signin', app.appUrl).href,
      new URL('/callback', app.appUrl).href,
      alice,
    );
    expect((await agent.request(callback.href)).response.status).toBe(303);
    // The provider's secret changes under the running app (the provider reads its clients from the
    // database): each refresh is refused invalid_client from now on.
    await rotateSecret(db, 'app-client-secret');
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => undefined);
    try {
      clock = 301_000;
      const refusals = () => warn.mock.calls.map((args) => format(...args)).filter((line) => line.includes('refused'));
      for (let i = 0; i < 3; i++) expect((await agent.request(new URL('/', app.appUrl).href)).body).toContain('Alice');
      // The first at once; the other two wait for a minute that never comes before the shutdown.
      expect(refusals()).toHaveLength(1);
      await app.closeApp();
      expect(refusals()).toHaveLength(2);
      expect(refusals()[1]).toMatch(/refused 2 refreshes \(invalid_client 2; the last HTTP 401/);
      // Closing the rest writes nothing more: the count was emptied.
      await app.close();
      running = undefined;
      expect(refusals()).toHaveLength(2);
    } finally {
      warn.mockRestore();
    }
  });
});
