import { randomUUID } from 'node:crypto';
import { sign } from '@idem/webhooks';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import { type Database, openDatabase } from '../src/db.js';
import { loadWebhookSecret } from '../src/schema/api-schema.js';

// A charge's payment.succeeded event, from the outbox through the relay to the receiver's inbox.
const issuer = 'https://issuer.receiver-test.example';
const audience = 'http://gateway.receiver-test';

let db: Database;
let stack: RunningResourceStack;
let privateKey: CryptoKey;

beforeAll(async () => {
  const pair = await generateKeyPair('ES256');
  privateKey = pair.privateKey;
  const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'receiver-test', alg: 'ES256' };
  db = await openDatabase({ memory: true });
  stack = await startResourceStack({
    db,
    gatewayPort: 0,
    apiPort: 0,
    receiverPort: 0,
    baseUrl: audience,
    issuers: [{ issuer, jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
    relay: false,
  });
  // Starting three servers and a database is slow on a loaded 2-core machine; nothing here waits on time.
}, 60_000);

afterAll(async () => {
  await stack?.close();
  await db?.close();
});

async function createCharge(amount: number): Promise<{ id: string }> {
  const token = await new SignJWT({ scope: 'charges:write', client_id: 'photo-app' })
    .setProtectedHeader({ alg: 'ES256', kid: 'receiver-test', typ: 'at+jwt' })
    .setIssuer(issuer)
    .setSubject('user-alice')
    .setAudience(audience)
    .setIssuedAt()
    .setExpirationTime('5m')
    .setJti(randomUUID())
    .sign(privateKey);
  const response = await fetch(new URL('/charges', stack.gateway.url), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ amount, currency: 'EUR' }),
  });
  expect(response.status).toBe(201);
  return (await response.json()) as { id: string };
}

interface EventRow {
  id: string;
  type: string | null;
  chargeId: string | null;
  amount: number | null;
  deliveries: number;
  applied: number;
}

async function events(): Promise<EventRow[]> {
  const response = await fetch(new URL('/events.json', stack.receiver.url));
  return ((await response.json()) as { events: EventRow[] }).events;
}

async function eventOf(chargeId: string): Promise<EventRow | undefined> {
  return (await events()).find((event) => event.chargeId === chargeId);
}

describe('payment.succeeded: delivered at least once, applied once', () => {
  it('the relay delivers a committed charge to the receiver, which applies it once', async () => {
    const charge = await createCharge(4200);
    expect(await eventOf(charge.id)).toBeUndefined();
    const round = await stack.api.relayOnce();
    expect(round.delivered).toBeGreaterThanOrEqual(1);
    expect(await eventOf(charge.id)).toMatchObject({
      id: `evt_${charge.id}`,
      type: 'payment.succeeded',
      amount: 4200,
      deliveries: 1,
      applied: 1,
    });
    const { rows } = await db.query<{ status: string }>('select status from api_webhook_outbox where id = $1', [
      `evt_${charge.id}`,
    ]);
    expect(rows[0]?.status).toBe('delivered');
  });

  it('a second delivery of the same event (a relay that died before recording) is not applied again', async () => {
    const charge = await createCharge(990);
    await stack.api.relayOnce();
    // What a crash between the receiver's 200 and the outbox update leaves: the row is pending again.
    await db.query(
      `update api_webhook_outbox set status = 'pending', next_attempt_at = now(), locked_until = null where id = $1`,
      [`evt_${charge.id}`],
    );
    const round = await stack.api.relayOnce();
    expect(round.delivered).toBe(1);
    expect(await eventOf(charge.id)).toMatchObject({ deliveries: 2, applied: 1 });
  });

  it('the events page shows deliveries and "once"', async () => {
    const charge = await createCharge(1234);
    await stack.api.relayOnce();
    const response = await fetch(stack.receiver.url);
    expect(response.status).toBe(200);
    expect(response.headers.get('content-security-policy')).toContain("frame-ancestors 'none'");
    const html = await response.text();
    const row = html.split('<tr').find((part) => part.includes(`evt_${charge.id}`));
    expect(row).toBeDefined();
    expect(row).toContain('<td class="deliveries">1</td>');
    expect(row).toContain('<td class="applied">once</td>');
  });
});

describe('receiver: what is refused', () => {
  const webhook = () => stack.receiver.webhookUrl;

  it('refuses an unsigned or wrongly signed delivery and records nothing', async () => {
    const id = `evt_forged_${randomUUID()}`;
    const body = JSON.stringify({ type: 'payment.succeeded', data: { id: 'ch_forged', amount: 1, currency: 'EUR' } });
    const wrong = sign({
      id,
      timestamp: Math.floor(Date.now() / 1000),
      body,
      secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`,
    });
    const response = await fetch(webhook(), {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...wrong },
      body,
    });
    expect(response.status).toBe(400);
    expect(await response.json()).toMatchObject({ code: 'signature_mismatch' });
    const unsigned = await fetch(webhook(), { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    expect(unsigned.status).toBe(400);
    expect((await events()).find((event) => event.id === id)).toBeUndefined();
  });

  it('applies an event once when its deliveries arrive concurrently', async () => {
    const secret = await loadWebhookSecret(db);
    const id = `evt_burst_${randomUUID()}`;
    const body = JSON.stringify({ type: 'payment.succeeded', data: { id: `ch_${id}`, amount: 5, currency: 'EUR' } });
    const headers = {
      'content-type': 'application/json',
      ...sign({ id, timestamp: Math.floor(Date.now() / 1000), body, secret }),
    };
    const statuses = await Promise.all(
      Array.from({ length: 5 }, async () => (await fetch(webhook(), { method: 'POST', headers, body })).status),
    );
    // 409 tells the sender to retry later; every other answer is the acknowledgement.
    expect(statuses.every((status) => status === 200 || status === 409)).toBe(true);
    expect(statuses).toContain(200);
    expect((await events()).find((event) => event.id === id)).toMatchObject({ applied: 1, deliveries: 5 });
  }, 60_000);

  it('refuses the same event id with another body (422) and keeps the first effect', async () => {
    const secret = await loadWebhookSecret(db);
    const id = `evt_reuse_${randomUUID()}`;
    const post = async (amount: number) => {
      const body = JSON.stringify({ type: 'payment.succeeded', data: { id: `ch_${id}`, amount, currency: 'EUR' } });
      const headers = sign({ id, timestamp: Math.floor(Date.now() / 1000), body, secret });
      return fetch(webhook(), { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
    };
    expect((await post(10)).status).toBe(200);
    expect((await post(10)).status).toBe(200);
    expect((await post(11)).status).toBe(422);
    expect((await events()).find((event) => event.id === id)).toMatchObject({ amount: 10, applied: 1, deliveries: 3 });
  });
});
