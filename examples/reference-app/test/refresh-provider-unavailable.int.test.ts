// A provider whose database fails answers the refresh 503 temporarily_unavailable (src/idp/unavailable.ts),
// a 5xx: that says nothing of the app's client or of the grant, so it is no `refresh-refused` for the
// operator (src/app/events.ts: "nor is a provider that cannot be reached, or answers 5xx"), and the session
// keeps its tokens. The provider's database really fails: its statements are refused as on a
// connection the server ends (57P01), the apps' own database works.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ThirdPartyAppEvent } from '../src/app/server.js';
import type { Database } from '../src/db.js';
import { terminated } from './db-faults.js';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';

describe('a refresh the provider answers 503 because its database fails', () => {
  let stack: TwoAppStack;
  /** The apps' clock, ahead of the real one by this much. */
  let clock = 0;
  let providerDown = false;
  /** Token requests that reached the provider, and what it answered them. */
  const tokenAnswers: number[] = [];
  const events: ThirdPartyAppEvent[] = [];

  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'refresh_provider_down',
      embedded: true,
      now: () => Date.now() + clock,
      wrapIdpDb: (db): Database => ({
        ...db,
        query: <Row>(text: string, params: readonly unknown[] = []) =>
          providerDown ? db.query<Row>(terminated) : db.query<Row>(text, params),
      }),
      authMiddleware: (provider) => (req, res) => {
        if (req.method === 'POST' && req.url?.split('?')[0] === '/token')
          res.on('finish', () => tokenAnswers.push(res.statusCode));
        provider(req, res);
      },
      app: () => ({ onEvent: (event) => events.push(event) }),
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
  });

  it('is not reported as a refusal, and the session keeps its tokens', async () => {
    const { id, cookie, tokens } = await stack.signIn();
    tokenAnswers.length = 0;
    clock = 301_000;
    providerDown = true;
    try {
      expect((await stack.page(0, cookie)).body).toContain('Alice');
    } finally {
      providerDown = false;
      clock = 0;
    }
    // The provider was asked, and answered 503 (its database failed), not a refusal of the client.
    expect(tokenAnswers).toEqual([503]);
    expect(events.filter((event) => event.type === 'refresh-refused')).toEqual([]);
    expect((await stack.sessions().get(id))?.tokens).toEqual(tokens);
  });
});
