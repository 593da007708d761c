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
const scope = 'openid profile email offline_access photos:read stock:read charges:write settings:write';
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
  }
}, 120_000);

afterAll(async () => {
  await stack?.close();
  await idp?.close();
  await closeTestRedis(redis);
  await db?.close();
});

async function call(username: string, method: string, path: string, body?: unknown) {
  const response = await fetch(new URL(path, stack.gateway.url), {
    method,
    headers: {
      authorization: `Bearer ${tokens.get(username)}`,
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

  it('authorizes from the roles the provider put in the token: alice is admin, bob is not', async () => {
    expect((await call('alice', 'PUT', '/stock/item-7', { level: 3 })).status).toBe(200);
    expect((await call('bob', 'PUT', '/stock/item-7', { level: 4 })).status).toBe(403);
    expect((await call('bob', 'GET', '/stock?item=item-7')).body).toEqual({ item: 'item-7', level: 3 });
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
  }, 60_000);
});
