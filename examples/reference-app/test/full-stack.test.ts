// The spec rows that need the whole app at once: access tokens from the real identity provider, sent
// to the real gateway, forwarded to the API, with the receiver behind it. The gateway's clock (and
// every check behind it) is injected, so an access token expires without anyone waiting for it.
import { createPublicKey, randomUUID } from 'node:crypto';
import { SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { startGateway } from '../src/gateway/server.js';
import type { RunningReferenceApp } from '../src/start.js';
import { codeFlow, introspect, tokenRequest } from './flow.js';
import { alice } from './test-idp.js';
import { startWholeStack, type WholeStack } from './test-stack.js';
import { decodeJwt } from './user-agent.js';

const scope = 'openid profile email offline_access photos:read photos:write stock:read charges:write settings:write';

let whole: WholeStack;
let db: Database;
let redis: WholeStack['redis'];
let running: RunningReferenceApp;
let stack: RunningResourceStack;
let offsetMs = 0;
let accessToken = '';

beforeAll(async () => {
  whole = await startWholeStack('full_stack', { now: () => Date.now() + offsetMs });
  ({ db, redis, running, stack } = whole);
  const flow = await codeFlow(running.authUrl, running.clients.app, alice, { scope });
  expect(flow.tokens.status).toBe(200);
  accessToken = flow.tokens.body.access_token as string;
}, 120_000);

afterAll(async () => {
  await whole?.close();
});

async function call(path: string, init: RequestInit & { token?: string; key?: string; json?: unknown } = {}) {
  const headers = new Headers(init.headers);
  if (init.token !== undefined) headers.set('authorization', `Bearer ${init.token}`);
  if (init.key !== undefined) headers.set('idempotency-key', init.key);
  if (init.json !== undefined) headers.set('content-type', 'application/json');
  const response = await fetch(new URL(path, stack.gateway.url), {
    ...init,
    headers,
    ...(init.json === undefined ? {} : { body: JSON.stringify(init.json) }),
  });
  const text = await response.text();
  return { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : undefined };
}

const charge = (key: string, amount = 500) =>
  call('/charges', { method: 'POST', token: accessToken, key, json: { amount, currency: 'EUR' } });

async function recordIds(table: string): Promise<Set<string>> {
  const { rows } = await db.query<{ id: string }>(`select id from ${table}`);
  return new Set(rows.map((row) => row.id));
}

/** Runs `action` and returns the one idempotency record it added to `table`. */
async function newRecord(table: string, action: () => Promise<unknown>): Promise<string> {
  const before = await recordIds(table);
  await action();
  const added = [...(await recordIds(table))].filter((id) => !before.has(id));
  expect(added).toHaveLength(1);
  return added[0] as string;
}

describe('tokens from the real identity provider at the gateway', () => {
  it('refuses alg "none" and HS256 "signed" with the provider\'s public key (RFC 9700 row 25)', async () => {
    const { payload } = decodeJwt(accessToken);
    const unsigned = [
      Buffer.from(JSON.stringify({ alg: 'none', typ: 'at+jwt' })).toString('base64url'),
      Buffer.from(JSON.stringify(payload)).toString('base64url'),
      '',
    ].join('.');
    const jwks = (await (await fetch(new URL('/jwks', running.authUrl))).json()) as { keys: Array<{ kid: string }> };
    const publicPem = createPublicKey({ key: jwks.keys[0] as never, format: 'jwk' }).export({
      type: 'spki',
      format: 'pem',
    });
    // The classic confusion attack: the public key, which everyone has, used as an HMAC secret.
    const confused = await new SignJWT(payload)
      .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt', kid: jwks.keys[0]?.kid ?? '' })
      .sign(new TextEncoder().encode(String(publicPem)));
    for (const token of [unsigned, confused]) {
      const response = await call('/photos', { token });
      expect(response.status).toBe(401);
      expect(response.headers.get('www-authenticate')).toContain('error="invalid_token"');
    }
    expect((await call('/photos', { token: accessToken })).status).toBe(200);
  });

  it('refuses an access token in the query string: only the Authorization header counts (row 27, spec 5.1)', async () => {
    const response = await call(`/photos?access_token=${encodeURIComponent(accessToken)}`);
    expect(response.status).toBe(401);
    expect(response.body).toMatchObject({ code: 'token_missing' });
  });

  it("refuses the provider's token at a resource server with another audience (row 23)", async () => {
    const other = await startGateway({
      port: 0,
      apiUrl: stack.api.url,
      authUrl: running.authUrl,
      baseUrl: 'http://another-api.example',
    });
    try {
      const response = await fetch(new URL('/photos', other.url), {
        headers: { authorization: `Bearer ${accessToken}` },
      });
      expect(response.status).toBe(401);
      expect(await response.json()).toMatchObject({ code: 'audience_invalid' });
    } finally {
      await other.close();
    }
  });

  it('issues a refresh token that lives hours where the access token lives minutes, traded for a new one the gateway takes (spec 5.8)', async () => {
    const flow = await codeFlow(running.authUrl, running.clients.app, alice, { scope });
    const { access_token: token, refresh_token: refreshToken } = flow.tokens.body;
    const access = decodeJwt(token).payload;
    expect(access.exp - access.iat).toBeLessThanOrEqual(10 * 60);
    const client = running.clients.app;
    const refresh = await introspect(running.authUrl, refreshToken, client);
    expect(refresh).toMatchObject({ active: true, client_id: client.clientId });
    // Long-lived next to the access token: the app's refresh token lasts as long as its session, until
    // 12 hours after the password (ASVS 3.3.2; a sign-in just now leaves nearly all of them). Other
    // clients' refresh tokens (offline access) live 14 days: sign-in-lifetime.audit.int.test.ts.
    const left = refresh.exp - Math.floor(Date.now() / 1000);
    expect(left).toBeGreaterThan(11 * 3600);
    expect(left).toBeLessThanOrEqual(12 * 3600);
    const traded = await tokenRequest(
      running.authUrl,
      { grant_type: 'refresh_token', refresh_token: refreshToken },
      client,
    );
    expect(traded.status).toBe(200);
    const fresh = traded.body.access_token as string;
    expect(fresh).not.toBe(token);
    expect(decodeJwt(fresh).payload).toMatchObject({ sub: access.sub, aud: access.aud, client_id: access.client_id });
    expect((await call('/photos', { token: fresh })).status).toBe(200);
  });

  it('revoking the refresh token ends access once the 5-minute access token expires (row 22, spec 5.8)', async () => {
    const flow = await codeFlow(running.authUrl, running.clients.app, alice, { scope });
    const { access_token: token, refresh_token: refreshToken, expires_in: expiresIn } = flow.tokens.body;
    expect(expiresIn).toBeLessThanOrEqual(300);
    const client = running.clients.app;
    const revoked = await fetch(new URL('/token/revocation', running.authUrl), {
      method: 'POST',
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        authorization: `Basic ${Buffer.from(`${client.clientId}:${client.clientSecret}`).toString('base64')}`,
      },
      body: new URLSearchParams({ token: refreshToken, token_type_hint: 'refresh_token' }),
    });
    expect(revoked.status).toBe(200);
    const refreshed = await tokenRequest(
      running.authUrl,
      { grant_type: 'refresh_token', refresh_token: refreshToken },
      client,
    );
    expect(refreshed.body.error).toBe('invalid_grant');
    // A JWT cannot be recalled: it works until it expires, which is why it lives 5 minutes.
    expect((await call('/photos', { token })).status).toBe(200);
    offsetMs = (Number(expiresIn) + 61) * 1000;
    try {
      const expired = await call('/photos', { token });
      expect(expired.status).toBe(401);
      expect(expired.headers.get('www-authenticate')).toContain('error="invalid_token"');
      expect(expired.body).toMatchObject({ code: 'token_expired' });
    } finally {
      offsetMs = 0;
    }
  });
});

describe('idempotency records on the running app (spec parts 3 and 8)', () => {
  it('keeps a charge key at least 24 hours (part 8), by the database clock', async () => {
    const id = await newRecord('api_idempotency_records', async () => {
      expect((await charge(`"${randomUUID()}"`)).status).toBe(201);
    });
    const { rows } = await db.query<{ seconds: number }>(
      'select extract(epoch from expires_at - now())::float8 as seconds from api_idempotency_records where id = $1',
      [id],
    );
    expect(rows[0]?.seconds).toBeGreaterThanOrEqual(24 * 3600 - 60);
  });

  it('forgets a key once its retention has passed: the same key then executes fresh (part 3, completed -> unseen)', async () => {
    const key = `"${randomUUID()}"`;
    let first: Awaited<ReturnType<typeof charge>> | undefined;
    const id = await newRecord('api_idempotency_records', async () => {
      first = await charge(key, 640);
    });
    expect(first?.status).toBe(201);
    const replay = await charge(key, 640);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.body.id).toBe(first?.body.id);
    // The store measures retention with the database's clock: move the record's end into the past,
    // which is what 24 hours passing would do.
    await db.query(`update api_idempotency_records set expires_at = now() - interval '1 second' where id = $1`, [id]);
    const fresh = await charge(key, 640);
    expect(fresh.status).toBe(201);
    expect(fresh.headers.get('idempotent-replayed')).toBeNull();
    expect(fresh.body.id).not.toBe(first?.body.id);
    const { rows } = await db.query<{ n: number }>(
      'select count(*)::int as n from api_charges where idempotency_key = $1',
      [key.slice(1, -1)],
    );
    expect(rows[0]?.n).toBe(2);
  });

  it('keeps a photo key at least 24 hours too, in Redis (PTTL) or in the SQL table', async () => {
    const key = `"${randomUUID()}"`;
    const created = await call('/photos', { method: 'POST', token: accessToken, key, json: { title: 'Caterpillar' } });
    expect(created.status).toBe(201);
    if (redis) {
      const keys = await redis.client.keys(`${redis.prefix}*`);
      const ttls = await Promise.all(keys.map((name) => redis?.client.pttl(name) ?? -1));
      expect(Math.max(...ttls)).toBeGreaterThanOrEqual((24 * 3600 - 60) * 1000);
    } else {
      const { rows } = await db.query<{ seconds: number }>(
        'select max(extract(epoch from expires_at - now()))::float8 as seconds from api_plain_idempotency_records',
      );
      expect(rows[0]?.seconds).toBeGreaterThanOrEqual(24 * 3600 - 60);
    }
  });

  it("keeps the receiver's event ids longer than the sender retries (part 8: retention outlives the retry horizon)", async () => {
    // Deliver what earlier tests left in the outbox, so the next round carries this charge's event alone.
    await stack.api.relayOnce();
    const created = await charge(`"${randomUUID()}"`, 71);
    const id = await newRecord('receiver_inbox_records', async () => {
      await stack.api.relayOnce();
    });
    expect(created.status).toBe(201);
    const { rows } = await db.query<{ seconds: number }>(
      'select extract(epoch from expires_at - now())::float8 as seconds from receiver_inbox_records where id = $1',
      [id],
    );
    // The API's sender gives up after 24 hours; the receiver remembers ids for 72.
    expect(rows[0]?.seconds).toBeGreaterThan(24 * 3600);
  });
});

describe('events (spec part 6)', () => {
  it('the sender retries an event until it is acknowledged, and the receiver applies it once', async () => {
    await stack.api.relayOnce();
    const created = await charge(`"${randomUUID()}"`, 1999);
    expect(created.status).toBe(201);
    const eventId = `evt_${created.body.id}`;
    // The receiver cannot apply anything while its table is away: it answers with an error, not 2xx.
    await db.exec('alter table receiver_events rename to receiver_events_away');
    try {
      const failed = await stack.api.relayOnce();
      expect(failed.delivered).toBe(0);
    } finally {
      await db.exec('alter table receiver_events_away rename to receiver_events');
    }
    // Put back to wait for another attempt (its wait recorded; drawn from [0, 1 s) with full jitter,
    // so it may already be over when read: whether it is due now says nothing).
    const pending = await db.query<{ status: string; attempts: number; waits: boolean }>(
      "select status, attempts, last_attempt ? 'waitMs' as waits from api_webhook_outbox where id = $1",
      [eventId],
    );
    expect(pending.rows[0]).toMatchObject({ status: 'pending', attempts: 1, waits: true });
    // The backoff has passed (the outbox reads the database clock): the next round delivers it.
    await db.query('update api_webhook_outbox set next_attempt_at = now() where id = $1', [eventId]);
    expect((await stack.api.relayOnce()).delivered).toBeGreaterThanOrEqual(1);
    const delivered = await db.query<{ status: string; attempts: number }>(
      'select status, attempts from api_webhook_outbox where id = $1',
      [eventId],
    );
    expect(delivered.rows[0]).toMatchObject({ status: 'delivered', attempts: 2 });
    const { rows } = await db.query<{ applied: number }>('select applied from receiver_events where id = $1', [
      eventId,
    ]);
    expect(rows).toEqual([{ applied: 1 }]);
  });
});
