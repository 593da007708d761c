// A client secret rotated at the provider only refuses every session's refresh, at every request that
// finds its token due: by default (no `onEvent`) the app tells the operator on stderr, the first
// refusal at once, then at most one line a minute with how many of each code came in, as the
// receiver does for refused webhook deliveries. One line per request would bury the log.
//
// The whole stack on the embedded PGlite: the provider, and two app processes, the second holding a
// client secret the provider does not know (oidc-provider refuses it: 401 invalid_client).
import { format } from 'node:util';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';

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
