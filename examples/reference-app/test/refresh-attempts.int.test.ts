// How many times one page load asks the provider for a refresh when the provider refuses it (a client
// secret rotated at the provider only: 401 invalid_client) and the API refuses the access token too (401
// invalid_token). The page's parallel reads each meet the API's 401 and ask for another token; a
// refresh they join that fails would fail again at once for the next (the same refresh token, the same
// client secret), so one page load asks the provider at most once, however many reads it makes.
//
// The whole stack on the embedded PGlite: the provider and two app processes (the second holds the
// client secret the provider does not know), both calling an API that refuses every token while told.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ListeningPort, listen } from '../src/listen.js';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';

describe('a page load whose refresh the provider refuses, with the API refusing the token', () => {
  let stack: TwoAppStack;
  let api: ListeningPort;
  /** The apps' clock, ahead of the real one by this much. */
  let clock = 0;
  /** Token requests that reached the provider (refreshes, once signed in). */
  let tokenRequests = 0;
  /** While true, the API answers every call 401 invalid_token, as the gateway's guard does. */
  let apiRefuses = false;

  beforeAll(async () => {
    api = await listen(0);
    api.use((_req, res) => {
      if (!apiRefuses) {
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
        return;
      }
      res
        .writeHead(401, {
          'content-type': 'application/problem+json',
          'www-authenticate': 'Bearer error="invalid_token"',
        })
        .end(JSON.stringify({ title: 'Unauthorized', status: 401 }));
    });
    stack = await startTwoAppStack({
      name: 'refresh_attempts',
      embedded: true,
      now: () => Date.now() + clock,
      authMiddleware: (provider) => (req, res) => {
        if (req.method === 'POST' && req.url?.split('?')[0] === '/token') tokenRequests++;
        provider(req, res);
      },
      app: (i, seeded) => ({
        baseUrl: api.url,
        // Three reads of stock, with photos and settings: five calls at once, each refused.
        stockItems: ['item-1', 'item-2', 'item-3'],
        onEvent: () => undefined,
        ...(i === 1 ? { clientSecret: `${seeded.clientSecret}-before-the-rotation` } : {}),
      }),
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
    await api?.close();
  });

  it('asks the provider once when the access token is due', async () => {
    const { cookie } = await stack.signIn();
    clock = 301_000;
    apiRefuses = true;
    tokenRequests = 0;
    try {
      const answer = await stack.page(1, cookie);
      expect(answer.status).toBe(200);
      expect(answer.body).toContain('Alice');
      expect(tokenRequests).toBe(1);
      // The next page load asks once more: one attempt per page load, never none.
      await stack.page(1, cookie);
      expect(tokenRequests).toBe(2);
    } finally {
      apiRefuses = false;
      clock = 0;
    }
  });

  it('asks the provider once when the API refuses a token the session holds for valid', async () => {
    const { cookie } = await stack.signIn();
    apiRefuses = true;
    tokenRequests = 0;
    try {
      const answer = await stack.page(1, cookie);
      expect(answer.status).toBe(200);
      expect(answer.body).toContain('Alice');
      expect(tokenRequests).toBe(1);
    } finally {
      apiRefuses = false;
    }
  });

  it('still refreshes once after the refusal when the provider takes it, and the reads go again', async () => {
    const { id, cookie, tokens } = await stack.signIn();
    apiRefuses = true;
    tokenRequests = 0;
    try {
      // The process with the provider's secret: the forced refresh works, the five reads share it.
      const answer = await stack.page(0, cookie);
      expect(answer.status).toBe(200);
      expect(tokenRequests).toBe(1);
    } finally {
      apiRefuses = false;
    }
    expect((await stack.sessions().get(id))?.tokens?.accessToken).not.toBe(tokens.accessToken);
  });
});
