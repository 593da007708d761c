// The provider refuses a refresh with an OAuth error. Only `invalid_grant` says the refresh token is
// revoked, reused or expired (RFC 6749 5.2): that session is over. Every other error says something
// else: `invalid_client` that the app's client secret is not the provider's (rotated at the provider,
// not yet at the app), which, taken for the end of the grant, signs out every user at their next
// refresh; `unauthorized_client`, `invalid_scope`, `invalid_request`, `temporarily_unavailable` (a 429)
// speak of the client or of the moment, never of this grant. Those keep the session and its refresh
// token, let the claim go (as for a provider that cannot be reached), and are reported to `onEvent`.
//
// The whole stack on PostgreSQL and PGlite: the provider, two app processes on one database, and the
// provider's token endpoint answering a chosen error while `refusal` is set, as providers that send no
// WWW-Authenticate challenge answer. The second process holds a client secret the provider does not
// know: oidc-provider refuses it for real (401 invalid_client, with a `Basic` challenge).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ThirdPartyAppEvent } from '../src/app/server.js';
import { databases } from './db-faults.js';
import { introspect } from './flow.js';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';

/** Errors that say nothing of the grant: status and OAuth error code, as a provider sends them. */
const notTheGrant: Array<[number, string]> = [
  [401, 'invalid_client'],
  [400, 'invalid_client'],
  [400, 'unauthorized_client'],
  [400, 'invalid_scope'],
  [400, 'invalid_request'],
  [429, 'temporarily_unavailable'],
];

describe.each(databases)('a refresh the provider refuses, on %s', (_name, embedded) => {
  let stack: TwoAppStack;
  /** The app's clock, ahead of the real one by this much (both processes share it). */
  let clock = 0;
  /** While set, the token endpoint answers with this, unasked of the provider. */
  let refusal: { status: number; error: string } | undefined;
  /** Requests that reached the token endpoint (refreshes, once signed in). */
  let refreshRequests = 0;
  /** What each process reported to `onEvent`. */
  const events: [ThirdPartyAppEvent[], ThirdPartyAppEvent[]] = [[], []];

  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'refresh_refused',
      embedded,
      now: () => Date.now() + clock,
      authMiddleware: (provider) => (req, res) => {
        const token = req.method === 'POST' && (req.url === '/token' || req.url?.startsWith('/token?'));
        if (!token) {
          provider(req, res);
          return;
        }
        // After the sign-in (the counter is reset then) every token request is a refresh.
        refreshRequests++;
        const current = refusal;
        if (!current) {
          provider(req, res);
          return;
        }
        // The refusal quotes the refresh token back, as a careless provider may: it must reach no event.
        const chunks: Buffer[] = [];
        req.on('data', (chunk: Buffer) => chunks.push(chunk));
        req.on('end', () => {
          const presented = new URLSearchParams(Buffer.concat(chunks).toString()).get('refresh_token');
          res
            .writeHead(current.status, { 'content-type': 'application/json', 'cache-control': 'no-store' })
            .end(JSON.stringify({ error: current.error, error_description: `refused: ${presented}` }));
        });
      },
      app: (i, seeded) => ({
        // The second process holds a client secret the provider does not know (rotated there only).
        clientSecret: i === 0 ? seeded.clientSecret : `${seeded.clientSecret}-before-the-rotation`,
        onEvent: (event) => events[i].push(event),
      }),
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
  });

  /** Signs alice in at the first process, by the real clock, with the provider taking refreshes. */
  async function signIn() {
    clock = 0;
    refusal = undefined;
    const signedIn = await stack.signIn();
    refreshRequests = 0;
    events[0].length = 0;
    events[1].length = 0;
    return signedIn;
  }
  const sessions = () => stack.sessions();
  const page = (i: 0 | 1, cookie: string) => stack.page(i, cookie);
  /** Who holds the claim on the session's refresh (null: nobody). */
  const claimOf = async (id: string) => (await stack.claimOf(id)).by;

  it.each(notTheGrant)(
    'keeps the session on a %i %s, and refreshes it once the provider takes the refresh',
    async (status, error) => {
      const { id, cookie, tokens } = await signIn();
      clock = 301_000;
      refusal = { status, error };
      try {
        // Two page loads: one refresh attempt each, no more (nothing retries in a loop), the session kept.
        for (const tries of [1, 2]) {
          const answer = await page(0, cookie);
          expect(answer.status).toBe(200);
          expect(answer.body).toContain('Alice');
          expect(refreshRequests).toBe(tries);
        }
      } finally {
        refusal = undefined;
      }
      expect((await sessions().get(id))?.tokens).toEqual(tokens);
      expect(await claimOf(id)).toBeNull();
      // The refresh token was never spent: it is live at the provider.
      expect(await introspect(stack.authUrl, tokens.refreshToken!, stack.client)).toMatchObject({ active: true });
      expect(events[0]).toEqual([
        { type: 'refresh-refused', error: expect.objectContaining({ error, status }) },
        { type: 'refresh-refused', error: expect.objectContaining({ error, status }) },
      ]);
      // Never the token, which a provider's error_description may quote back.
      expect(
        JSON.stringify(events[0].map((event) => ({ ...event.error, message: event.error.message }))),
      ).not.toContain(tokens.refreshToken);

      // The provider takes the refresh again (the secret is right once more): the next page refreshes.
      expect((await page(0, cookie)).body).toContain('Alice');
      const now = (await sessions().get(id))?.tokens;
      expect(now?.refreshToken).not.toBe(tokens.refreshToken);
      expect(now?.accessToken).not.toBe(tokens.accessToken);
      expect(await introspect(stack.authUrl, now!.refreshToken!, stack.client)).toMatchObject({ active: true });
    },
  );

  it('keeps the session at a process whose client secret the provider no longer knows, and the other refreshes it', async () => {
    const { id, cookie, tokens } = await signIn();
    clock = 301_000;
    // oidc-provider itself: 401 invalid_client, with a `Basic` challenge.
    const answer = await page(1, cookie);
    expect(answer.status).toBe(200);
    expect(answer.body).toContain('Alice');
    expect(refreshRequests).toBe(1);
    expect((await sessions().get(id))?.tokens).toEqual(tokens);
    expect(await claimOf(id)).toBeNull();
    expect(events[1]).toEqual([
      { type: 'refresh-refused', error: expect.objectContaining({ error: 'invalid_client', status: 401 }) },
    ]);
    // A process with the provider's secret refreshes the same session at once.
    expect((await page(0, cookie)).body).toContain('Alice');
    const now = (await sessions().get(id))?.tokens;
    expect(now?.refreshToken).not.toBe(tokens.refreshToken);
    expect(await introspect(stack.authUrl, now!.refreshToken!, stack.client)).toMatchObject({ active: true });
  });

  it('ends the session on invalid_grant: the grant was revoked at the provider', async () => {
    const { id, cookie, tokens } = await signIn();
    // Revoked at the provider (RFC 7009), as an administrator or the user's "sign out everywhere" does.
    const basic = Buffer.from(
      `${encodeURIComponent(stack.client.clientId)}:${encodeURIComponent(stack.client.clientSecret)}`,
    );
    const revoked = await fetch(new URL('/token/revocation', stack.authUrl), {
      method: 'POST',
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        authorization: `Basic ${basic.toString('base64')}`,
      },
      body: new URLSearchParams({ token: tokens.refreshToken!, token_type_hint: 'refresh_token' }),
    });
    expect(revoked.status).toBe(200);
    clock = 301_000;
    const answer = await page(0, cookie);
    expect(answer.body).not.toContain('Alice');
    expect(refreshRequests).toBe(1);
    expect(await sessions().get(id)).toBeUndefined();
    // The end of a grant is the user's, not the operator's: nothing to report.
    expect(events[0]).toEqual([]);
  });

  it('ends the session on an invalid_grant of any status', async () => {
    const { id, cookie } = await signIn();
    clock = 301_000;
    refusal = { status: 401, error: 'invalid_grant' };
    try {
      expect((await page(0, cookie)).body).not.toContain('Alice');
    } finally {
      refusal = undefined;
    }
    expect(await sessions().get(id)).toBeUndefined();
  });
});
