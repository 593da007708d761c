// The gateway in front of the API, trusting the real identity provider of the reference app: keys
// from the provider's discovery document and JWKS, access tokens from a real code flow (PKCE).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { demoUsers } from '../src/seed.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { codeFlow } from './flow.js';
import { closeTestRedis, openTestDatabase, openTestRedis } from './services.js';
import { decodeJwt } from './user-agent.js';

// The resource indicator the provider binds tokens to, and the gateway's audience; the gateway itself
// listens on an ephemeral port.
const baseUrl = 'http://gateway.idp-test';
// What the third-party app asks for, and what an operator's tool asks for: the scopes that act with
// the user's admin role. A role is never enough on its own: the token must carry the scope too.
const scope = 'openid profile email offline_access photos:read stock:read charges:write settings:read settings:write';
const adminScope = 'openid stock:write events:read';
/** The public client (native, any loopback port), as an operator's command-line tool would use it. */
const cli = () => ({ clientId: idp.clients.publicClient.clientId, redirectUri: 'http://127.0.0.1:4321/callback' });
const password = (username: string) => demoUsers.find((user) => user.username === username)?.password ?? '';

let db: Database;
let redis: Awaited<ReturnType<typeof openTestRedis>>;
let idp: RunningReferenceApp;
let stack: RunningResourceStack;
const tokens = new Map<string, string>();

beforeAll(async () => {
  db = await openTestDatabase('gateway_idp');
  redis = await openTestRedis('gateway_idp');
  idp = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl });
  stack = await startResourceStack({
    db,
    gatewayPort: 0,
    apiPort: 0,
    receiverPort: 0,
    baseUrl,
    authUrl: idp.authUrl,
    relay: false,
    ...(redis ? { redis } : {}),
  });
  for (const username of ['alice', 'bob']) {
    const flow = await codeFlow(idp.authUrl, idp.clients.app, { username, password: password(username) }, { scope });
    expect(flow.tokens.status).toBe(200);
    tokens.set(username, flow.tokens.body.access_token as string);
    const admin = await codeFlow(idp.authUrl, cli(), { username, password: password(username) }, { scope: adminScope });
    expect(admin.tokens.status).toBe(200);
    tokens.set(`${username}-admin`, admin.tokens.body.access_token as string);
  }
}, 120_000);

afterAll(async () => {
  await stack?.close();
  await idp?.close();
  await closeTestRedis(redis);
  await db?.close();
});

/** Calls through the gateway with the token named `who` (`alice`, `bob-admin`, ...) or a token itself. */
async function call(who: string, method: string, path: string, body?: unknown) {
  const response = await fetch(new URL(path, stack.gateway.url), {
    method,
    headers: {
      authorization: `Bearer ${tokens.get(who) ?? who}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await response.text();
  return { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : undefined };
}

describe('gateway with the reference identity provider', () => {
  it('gets RFC 9068 access tokens for its own audience', () => {
    const { header, payload } = decodeJwt(tokens.get('alice') ?? '');
    expect(String(header.typ).toLowerCase()).toBe('at+jwt');
    expect(payload.aud).toBe(baseUrl);
    expect(payload.iss).toBe(idp.authUrl);
  });

  it('lets alice and bob see their own photos, and only theirs', async () => {
    const alice = await call('alice', 'GET', '/photos');
    const bob = await call('bob', 'GET', '/photos');
    expect(alice.status).toBe(200);
    expect(alice.body.photos.map((photo: { id: string }) => photo.id)).toEqual([
      'photo-alice-1',
      'photo-alice-2',
      'photo-alice-3',
    ]);
    expect(bob.body.photos.map((photo: { id: string }) => photo.id)).toEqual(['photo-bob-1', 'photo-bob-2']);
  });

  it('sets a stock level only with the admin role and the scope stock:write together', async () => {
    expect((await call('alice-admin', 'PUT', '/stock/item-7', { level: 3 })).status).toBe(200);
    // bob consented to stock:write, but he is no admin.
    expect((await call('bob-admin', 'PUT', '/stock/item-7', { level: 4 })).status).toBe(403);
    // alice is an admin, but the photo app's token was never meant to set stock.
    const app = await call('alice', 'PUT', '/stock/item-7', { level: 5 });
    expect(app.status).toBe(403);
    expect(app.headers.get('www-authenticate')).toContain('scope="stock:write"');
    expect((await call('bob', 'GET', '/stock?item=item-7')).body).toEqual({ item: 'item-7', level: 3 });
  });

  it('lists received webhook events only with the admin role and the scope events:read together', async () => {
    expect((await call('alice-admin', 'GET', '/webhook-events')).status).toBe(200);
    expect((await call('bob-admin', 'GET', '/webhook-events')).status).toBe(403);
    const app = await call('alice', 'GET', '/webhook-events');
    expect(app.status).toBe(403);
    expect(app.headers.get('www-authenticate')).toContain('scope="events:read"');
  });

  it('reads the settings only with the scope settings:read', async () => {
    expect(await call('alice', 'GET', '/settings')).toMatchObject({ status: 200, body: { theme: 'light' } });
    const other = await call('alice-admin', 'GET', '/settings');
    expect(other.status).toBe(403);
    expect(other.headers.get('www-authenticate')).toContain('scope="settings:read"');
  });

  it('creates a charge with a provider token and refuses that token once tampered', async () => {
    const charge = await call('alice', 'POST', '/charges', { amount: 100, currency: 'EUR' });
    expect(charge.status).toBe(201);
    const [header, payload, signature] = (tokens.get('alice') ?? '').split('.');
    const claims = JSON.parse(Buffer.from(payload ?? '', 'base64url').toString());
    claims.roles = ['admin', 'superuser'];
    const tampered = `${header}.${Buffer.from(JSON.stringify(claims)).toString('base64url')}.${signature}`;
    const response = await fetch(new URL('/photos', stack.gateway.url), {
      headers: { authorization: `Bearer ${tampered}` },
    });
    expect(response.status).toBe(401);
  });

  it('refuses the ID token as an access token', async () => {
    const flow = await codeFlow(
      idp.authUrl,
      idp.clients.app,
      { username: 'alice', password: password('alice') },
      { scope },
    );
    const response = await fetch(new URL('/photos', stack.gateway.url), {
      headers: { authorization: `Bearer ${flow.tokens.body.id_token}` },
    });
    expect(response.status).toBe(401);
    expect(response.headers.get('www-authenticate')).toContain('error="invalid_token"');
    // Refused for its type (RFC 9068 §4: typ is not at+jwt), before its audience (the client) is looked at
    // (research row 24): an ID token is never an access token, whatever its aud says.
    expect(await response.json()).toMatchObject({ code: 'type_invalid' });
  }, 60_000);
});

describe('least privilege of delegated tokens', () => {
  const alice = () => ({ username: 'alice', password: password('alice') });

  // What the user's role or an API scope would allow: none of it without a granted API scope.
  const roleAndScopeActions = [
    ['PUT', '/stock/item-8', { level: 0 }],
    ['GET', '/webhook-events', undefined],
    ['GET', '/settings', undefined],
  ] as const;

  it('a client that asked for no API scope gets no token for the API: the gateway refuses it (401)', async () => {
    // alice, an admin, signs in to the public client and consents to "Know who you are" only.
    const flow = await codeFlow(idp.authUrl, cli(), alice(), { scope: 'openid' });
    expect(flow.tokens.status).toBe(200);
    const token = flow.tokens.body.access_token as string;
    expect(token.split('.')).not.toHaveLength(3);
    for (const [method, path, body] of roleAndScopeActions) {
      expect((await call(token, method, path, body)).status, `${method} ${path}`).toBe(401);
    }
    expect((await call('bob', 'GET', '/stock?item=item-8')).body).toEqual({ item: 'item-8', level: 6 });
  }, 60_000);

  it('a token for the API with no API scope carries no roles and is refused everything (403)', async () => {
    const flow = await codeFlow(idp.authUrl, cli(), alice(), { scope: 'openid', resource: baseUrl });
    expect(flow.tokens.status).toBe(200);
    const token = flow.tokens.body.access_token as string;
    const { payload } = decodeJwt(token);
    expect(payload.aud).toBe(baseUrl);
    expect(payload.roles).toBeUndefined();
    for (const [method, path, body] of roleAndScopeActions) {
      expect((await call(token, method, path, body)).status, `${method} ${path}`).toBe(403);
    }
    expect((await call('bob', 'GET', '/stock?item=item-8')).body).toEqual({ item: 'item-8', level: 6 });
  }, 60_000);
});
