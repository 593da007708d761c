// RFC 9700 (OAuth 2.0 Security BCP) and OpenID Connect Core, walked against the whole running app: the
// provider, the gateway in front of the API, the public and the confidential client. The rows the other
// files pin (redirect URI matching, PKCE, code replay, rotation, logout, framing) are not repeated here.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { demoUsers } from '../src/seed.js';
import { type Credentials, codeFlow, tokenRequest } from './flow.js';
import { startWholeStack, type WholeStack } from './test-stack.js';
import { decodeJwt } from './user-agent.js';

const alice = { username: 'alice', password: demoUsers[0].password };

let whole: WholeStack;
let app: Required<Credentials>;
let cli: Credentials;
const auth = () => whole.running.authUrl;

beforeAll(async () => {
  whole = await startWholeStack('bcp');
  app = { ...whole.running.clients.app };
  // A native public client may use any loopback port (RFC 8252 section 7.3).
  cli = { clientId: whole.running.clients.publicClient.clientId, redirectUri: 'http://127.0.0.1:4321/callback' };
});

afterAll(async () => {
  await whole?.close();
});

const refresh = (token: string, client: Credentials, extra: Record<string, string> = {}) =>
  tokenRequest(auth(), { grant_type: 'refresh_token', refresh_token: token, ...extra }, client);

describe('a refresh refused for its resource indicator (RFC 8707) leaves the refresh token as it was', () => {
  it.each([
    ['the confidential app', () => app, undefined],
    ['the public client', () => cli, 'openid offline_access photos:read'],
  ])(
    '%s: a mistyped resource is invalid_target, and the same refresh token then still works',
    async (_name, client, scope) => {
      const { tokens } = await codeFlow(auth(), client(), alice, scope ? { scope } : {});
      const refreshToken = tokens.body.refresh_token as string;
      // The API with a trailing slash: not the resource indicator the grant holds.
      const refused = await refresh(refreshToken, client(), { resource: `${whole.stack.gateway.baseUrl}/` });
      expect(refused.status).toBe(400);
      expect(refused.body.error).toBe('invalid_target');
      // Was wrong: oidc-provider consumed (rotated) the refresh token before it resolved the resource, so
      // the refused request used it up without handing out the new one; the client's next refresh, with
      // the only token it has, looked like reuse and revoked the whole grant.
      const next = await refresh(refreshToken, client());
      expect(next.status).toBe(200);
      expect(decodeJwt(next.body.access_token).payload.aud).toBe(whole.stack.gateway.baseUrl);
      // Naming the granted resource, as RFC 8707 allows, refreshes as before.
      const named = await refresh(next.body.refresh_token, client(), { resource: whole.stack.gateway.baseUrl });
      expect(named.status).toBe(200);
    },
  );

  it('pins: a used refresh token presented again still revokes the grant (the contrast)', async () => {
    const { tokens } = await codeFlow(auth(), cli, alice, { scope: 'openid offline_access photos:read' });
    const first = await refresh(tokens.body.refresh_token, cli);
    expect(first.status).toBe(200);
    expect((await refresh(tokens.body.refresh_token, cli)).body.error).toBe('invalid_grant');
    expect((await refresh(first.body.refresh_token, cli)).body.error).toBe('invalid_grant');
  });
});

describe('introspection (RFC 7662 section 2.1: the endpoint MUST require some form of authorization)', () => {
  const introspectAs = (token: string, headers: Record<string, string>, fields: Record<string, string> = {}) =>
    fetch(new URL('/token/introspection', auth()), {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
      body: new URLSearchParams({ token, ...fields }),
    }).then(async (response) => ({
      status: response.status,
      body: (await response.json()) as Record<string, unknown>,
    }));

  it('tells a caller that names the public client, and proves nothing, nothing about its tokens', async () => {
    const { tokens } = await codeFlow(auth(), cli, alice, { scope: 'openid offline_access photos:read' });
    // Was wrong: a client_id alone was enough (the public client has no secret), and anyone got back
    // `active`, the user's `sub`, the scopes and the expiry of whatever cli-pkce token they held or guessed.
    const answer = await introspectAs(tokens.body.refresh_token, {}, { client_id: cli.clientId });
    expect(answer.body).toEqual({ active: false });
    // The token itself is live: refused for who asked, not for what it is.
    expect((await refresh(tokens.body.refresh_token, cli)).status).toBe(200);
  });

  it('pins: the confidential app, authenticated, introspects its own refresh token (the contrast)', async () => {
    const { tokens } = await codeFlow(auth(), app, alice);
    const basic = Buffer.from(`${app.clientId}:${app.clientSecret}`).toString('base64');
    const answer = await introspectAs(tokens.body.refresh_token, { authorization: `Basic ${basic}` });
    expect(answer.body).toMatchObject({ active: true, client_id: app.clientId, sub: 'user-alice' });
  });
});
