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
