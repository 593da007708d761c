// Audit (rotating secrets and keys on a live system): the reference app on PostgreSQL (a schema of
// this file's own), with the identity provider restarted on rotated secrets while the gateway, the
// API and the receiver keep running, as when they are separate deployments. Each rotation is a step
// of `npm run rotate -- <step>` (src/rotate-secrets.ts), the runbook of docs/operations.md ("Rotating
// secrets and keys"). What must hold: no token of either key is refused while it lives, refresh
// tokens and sign-in sessions survive, events waiting in the outbox are delivered and applied once.
//
// The gateway's clock is the wall clock plus an offset the test moves forward, so "wait for the
// guard's JWKS cooldown" is a step of the clock, not a sleep. The provider runs on the wall clock.
import { randomBytes, randomUUID } from 'node:crypto';
import { createSigner, generateSecret } from '@idem/webhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import { type Database, openDatabase } from '../src/db.js';
import { migrateIdp } from '../src/idp/schema.js';
import { createIdp } from '../src/idp/server.js';
import { type ListeningPort, listen } from '../src/listen.js';
import { rotateSecret } from '../src/rotate-secrets.js';
import { type SeededClients, seed } from '../src/seed.js';
import { authorizationUrl, codeFlow, openLoginForm, tokenRequest } from './flow.js';
import { databaseUrl, postgresForCrashAudit } from './killable-app.js';
import { restartablePorts } from './ports.js';
import { alice } from './test-idp.js';
import { createUserAgent, decodeJwt, type UserAgent } from './user-agent.js';

const available = await postgresForCrashAudit('the reference-app rotation audit');

describe.runIf(available)('rotating the reference app secrets and keys while it runs', () => {
  const schema = `audit_rotation_${randomBytes(4).toString('hex')}`;
  let db: Database;
  let authPort: number;
  let baseUrl: string;
  let authUrl: string;
  let appRedirectUri: string;
  let idp: { port: ListeningPort; clients: SeededClients } | undefined;
  let stack: RunningResourceStack | undefined;
  // Fixed ports, as in a deployment: an outbox row keeps the receiver URL it was added with.
  let apiPort: number;
  let receiverPort: number;
  let offsetMs = 0;
  const now = () => Date.now() + offsetMs;

  // The provider alone, as start.ts starts it: migrations, seed, provider, on its fixed port (the
  // issuer is its URL, so tokens from before a restart are only good after it on the same one).
  async function startIdp() {
    const port = await listen(authPort);
    await migrateIdp(db);
    const clients = await seed(db, { appRedirectUri });
    const created = await createIdp({ db, issuer: port.url, resource: baseUrl });
    port.use(created.app);
    idp = { port, clients };
    return idp;
  }
  async function restartIdp() {
    await idp?.port.close();
    return startIdp();
  }
  async function startStack() {
    const gatewayPort = Number(new URL(baseUrl).port);
    stack = await startResourceStack({
      db,
      gatewayPort,
      apiPort,
      receiverPort,
      baseUrl,
      authUrl,
      relay: false,
      now,
    });
    return stack;
  }
  const client = () => {
    if (!idp) throw new Error('the provider is not running');
    return idp.clients.app;
  };
  const photos = async (accessToken: string) =>
    (await fetch(new URL('/photos', baseUrl), { headers: { authorization: `Bearer ${accessToken}` } })).status;
  // A charge with `key`: the stored response is replayed for a retry with the same key by the same
  // caller, whatever key signed the caller's token (record ids and keyFor hash no secret).
  const chargeWith = async (accessToken: string, key: string) => {
    const response = await fetch(new URL('/charges', baseUrl), {
      method: 'POST',
      headers: {
        authorization: `Bearer ${accessToken}`,
        'content-type': 'application/json',
        'idempotency-key': `"${key}"`,
      },
      body: JSON.stringify({ amount: 700, currency: 'EUR' }),
    });
    const body = (await response.json()) as { id: string };
    return { status: response.status, replayed: response.headers.get('idempotent-replayed') === 'true', id: body.id };
  };
  const refresh = (refreshToken: string, secret = client().clientSecret) =>
    tokenRequest(
      authUrl,
      { grant_type: 'refresh_token', refresh_token: refreshToken },
      { ...client(), clientSecret: secret },
    );
  const jwksKids = async () =>
    ((await (await fetch(new URL('/jwks', authUrl))).json()) as { keys: { kid: string }[] }).keys.map((key) => key.kid);
  const kidOf = (token: string) => decodeJwt(token).header.kid as string;
  // Whether `agent` is still signed in at the provider: an authorization request shows the consent
  // page (signed in) rather than the login page.
  const signedInAtProvider = async (agent: UserAgent) => {
    const page = await agent.follow(
      authorizationUrl(authUrl, {
        clientId: client().clientId,
        redirectUri: client().redirectUri,
        challenge: 'x'.repeat(43),
        challengeMethod: 'S256',
      }),
    );
    if (page.body.includes('<h1>Sign in</h1>')) return false;
    expect(page.body).toContain('<h1>Allow access</h1>');
    return true;
  };

  beforeAll(async () => {
    db = await openDatabase({ url: databaseUrl, schema });
    const [auth, gateway, app, api, receiver] = (await restartablePorts(5)) as [number, number, number, number, number];
    authPort = auth;
    authUrl = `http://localhost:${authPort}`;
    baseUrl = `http://localhost:${gateway}`;
    appRedirectUri = `http://localhost:${app}/callback`;
    apiPort = api;
    receiverPort = receiver;
    await startIdp();
    await startStack();
  }, 60_000);

  afterAll(async () => {
    await stack?.close();
    await idp?.port.close();
    await db?.query(`drop schema if exists ${schema} cascade`);
    await db?.close();
  });

  it('the provider signing and cookie keys, staged: tokens of both keys pass the gateway, refresh tokens and sign-in sessions survive every restart', {
    timeout: 60_000,
  }, async () => {
    const first = await codeFlow(authUrl, client(), alice);
    expect(first.tokens.status).toBe(200);
    const oldAccess = first.tokens.body.access_token as string;
    const oldKid = kidOf(oldAccess);
    expect(await photos(oldAccess)).toBe(200);
    const key = randomUUID();
    const charged = await chargeWith(oldAccess, key);
    expect(charged).toMatchObject({ status: 201, replayed: false });
    // A second browser signed in at the provider that will not come back during the rotation.
    const absent = (await codeFlow(authUrl, client(), alice)).agent;

    // Step 1: a new signing key is published (it signs nothing yet), and a new cookie key signs.
    await rotateSecret(db, 'signing-stage');
    await rotateSecret(db, 'cookie-add');
    await restartIdp();
    const kids = await jwksKids();
    expect(kids).toHaveLength(2);
    expect(kids[0]).toBe(oldKid);
    const newKid = kids[1] as string;
    const staged = await refresh(first.tokens.body.refresh_token);
    expect(staged.status).toBe(200);
    expect(kidOf(staged.body.access_token)).toBe(oldKid);
    expect(await photos(staged.body.access_token)).toBe(200);
    // The session cookie signed with the old cookie key still signs in, and is signed again with the
    // new one on its way back.
    expect(await signedInAtProvider(first.agent)).toBe(true);

    // Step 2, once every verifier may fetch again (the guard's cooldown: 30 s): the new key signs.
    offsetMs += 31_000;
    await rotateSecret(db, 'signing-promote');
    await restartIdp();
    expect(await jwksKids()).toEqual([newKid, oldKid]);
    const promoted = await refresh(staged.body.refresh_token);
    expect(promoted.status).toBe(200);
    expect(kidOf(promoted.body.access_token)).toBe(newKid);
    expect(await photos(promoted.body.access_token)).toBe(200);
    expect(await photos(oldAccess)).toBe(200);

    // Step 3: the old keys are removed. The refresh token of the same grant still works, and the
    // session whose cookie came back during the rotation is still signed in; the one that never
    // came back has to sign in again at the provider.
    await rotateSecret(db, 'signing-retire');
    await rotateSecret(db, 'cookie-retire');
    await restartIdp();
    expect(await jwksKids()).toEqual([newKid]);
    const retired = await refresh(promoted.body.refresh_token);
    expect(retired.status).toBe(200);
    expect(kidOf(retired.body.access_token)).toBe(newKid);
    expect(await photos(retired.body.access_token)).toBe(200);
    expect(await signedInAtProvider(first.agent)).toBe(true);
    expect(await signedInAtProvider(absent)).toBe(false);
    // A retry of the first charge, with a token the new key signed, is its replay.
    expect(await chargeWith(retired.body.access_token, key)).toEqual({ status: 201, replayed: true, id: charged.id });
  });

  it('the third-party app client secret: the old secret is refused after the restart, the refresh tokens of the client keep working with the new one', {
    timeout: 30_000,
  }, async () => {
    const flow = await codeFlow(authUrl, client(), alice, {}, createUserAgent());
    const oldSecret = client().clientSecret;
    await rotateSecret(db, 'app-client-secret');
    await restartIdp();
    expect(client().clientSecret).not.toBe(oldSecret);
    const refused = await refresh(flow.tokens.body.refresh_token, oldSecret);
    expect(refused.status).toBe(401);
    expect(refused.body.error).toBe('invalid_client');
    const refreshed = await refresh(flow.tokens.body.refresh_token);
    expect(refreshed.status).toBe(200);
  });

  it('the login form key (csrf): a form open across the restart is refused once with a page that says to start again; the next one signs in', {
    timeout: 30_000,
  }, async () => {
    const { agent, action, csrf } = await openLoginForm(authUrl, client());
    await rotateSecret(db, 'csrf');
    await restartIdp();
    const stale = await agent.postForm(action, { csrf, ...alice });
    expect(stale.response.status).toBe(403);
    expect(stale.body).toContain('Start again');
    const fresh = await codeFlow(authUrl, client(), alice, {}, agent);
    expect(fresh.tokens.status).toBe(200);
  });

  // Was wrong: the API and the receiver were handed a copy of the gateway's internal-token JWKS
  // (`internalIssuer.jwks()`) at start. A `stack.gateway.internalIssuer.rotate()` (guard.md's way to
  // roll the key) made every request through the gateway 401 once the new key signed, 60 s later,
  // until the process restarted. Fixed: they read `() => internalIssuer.jwks()` on every lookup.
  it('the gateway internal-token key rotated in place: the API keeps answering before and after the new key signs', {
    timeout: 30_000,
  }, async () => {
    const running = stack as RunningResourceStack;
    const flow = await codeFlow(authUrl, client(), alice);
    const access = flow.tokens.body.access_token as string;
    expect(await photos(access)).toBe(200);
    const key = randomUUID();
    const charged = await chargeWith(access, key);
    expect(charged).toMatchObject({ status: 201, replayed: false });
    running.gateway.internalIssuer.rotate();
    expect(await photos(access)).toBe(200);
    offsetMs += 61_000;
    expect(await photos(access)).toBe(200);
    expect(await chargeWith(access, key)).toEqual({ status: 201, replayed: true, id: charged.id });
  });

  it('the webhook secret: events waiting in the outbox are signed with the new one after the restart and applied once; the old one is refused', {
    timeout: 60_000,
  }, async () => {
    const flow = await codeFlow(authUrl, client(), alice);
    const charge = async () => {
      const response = await fetch(new URL('/charges', baseUrl), {
        method: 'POST',
        headers: {
          authorization: `Bearer ${flow.tokens.body.access_token}`,
          'content-type': 'application/json',
          'idempotency-key': `"${randomUUID()}"`,
        },
        body: JSON.stringify({ amount: 1200, currency: 'EUR' }),
      });
      expect(response.status).toBe(201);
      return ((await response.json()) as { id: string }).id;
    };
    const delivered = await charge();
    expect((await (stack as RunningResourceStack).api.relayOnce()).delivered).toBeGreaterThanOrEqual(1);
    const waiting = await charge();
    const oldSecret = (
      await db.query<{ secret: string }>("select secret from api_webhook_secrets where name = 'payments'")
    ).rows[0]?.secret as string;

    await stack?.close();
    await rotateSecret(db, 'webhook');
    const restarted = await startStack();
    // The waiting event goes out signed with the new secret, and is applied.
    expect((await restarted.api.relayOnce()).delivered).toBeGreaterThanOrEqual(1);
    const events = await db.query<{ charge_id: string; applied: number }>(
      'select charge_id, applied from receiver_events where charge_id = any($1) order by charge_id',
      [[delivered, waiting]],
    );
    expect(events.rows.map((row) => row.applied)).toEqual([1, 1]);

    // A delivery signed with the old secret is refused; the event delivered before the rotation,
    // sent again signed with the new one, is acknowledged without a second effect.
    const event = (
      await db.query<{ id: string; body: Buffer }>('select id, body from api_webhook_outbox where id = $1', [
        `evt_${delivered}`,
      ])
    ).rows[0];
    expect(event).toBeDefined();
    const post = (secret: string) =>
      fetch(restarted.receiver.webhookUrl, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          ...createSigner({ secret }).sign({
            id: event?.id as string,
            body: event?.body as Buffer,
            timestamp: new Date(),
          }),
        },
        body: new Uint8Array(event?.body as Buffer),
      });
    expect((await post(oldSecret)).status).toBe(400);
    const newSecret = (
      await db.query<{ secret: string }>("select secret from api_webhook_secrets where name = 'payments'")
    ).rows[0]?.secret as string;
    expect(newSecret).not.toBe(oldSecret);
    expect((await post(newSecret)).status).toBe(200);
    expect((await post((generateSecret('v1') as { secret: string }).secret)).status).toBe(400);
    const again = await db.query<{ applied: number }>('select applied from receiver_events where charge_id = $1', [
      delivered,
    ]);
    expect(again.rows[0]?.applied).toBe(1);
  });

  it('a rotation step that cannot apply says why: promote with nothing staged, an unknown step, a database the app never started on', async () => {
    await expect(rotateSecret(db, 'signing-promote')).rejects.toThrow(/no signing key is staged/);
    await expect(rotateSecret(db, 'everything' as never)).rejects.toThrow(TypeError);
    const empty = await openDatabase({ url: databaseUrl, schema: `${schema}_empty` });
    try {
      await expect(rotateSecret(empty, 'csrf')).rejects.toThrow(/start the app once/);
    } finally {
      await empty.query(`drop schema if exists ${schema}_empty cascade`);
      await empty.close();
    }
  });
});
