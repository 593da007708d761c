// The resource side (gateway, API, receiver) on a real PostgreSQL (DATABASE_URL) instead of PGlite:
// pg Pool connections run the claims, the charge transactions and the outbox relay concurrently.
// Everything lives in a schema of its own, dropped afterwards.
import { randomBytes, randomUUID } from 'node:crypto';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import { type Database, openDatabase } from '../src/db.js';
import { allScopes } from './test-stack.js';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

async function reachable(): Promise<boolean> {
  const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: 3000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.query('select 1');
    return true;
  } catch (error) {
    if (process.env.CI === 'true') {
      throw new Error(`PostgreSQL at ${databaseUrl} is unreachable and CI=true`, { cause: error });
    }
    console.warn(`\n*** SKIPPING reference-app API tests on PostgreSQL: ${databaseUrl} is unreachable ***\n`);
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}

const available = await reachable();
const schema = `refapi_${randomBytes(6).toString('hex')}`;
const issuer = 'https://issuer.api-int-test.example';
const audience = 'http://gateway.api-int-test';

describe.runIf(available)('gateway, API and receiver on PostgreSQL', () => {
  let db: Database;
  let stack: RunningResourceStack;
  let privateKey: CryptoKey;

  beforeAll(async () => {
    const pair = await generateKeyPair('ES256');
    privateKey = pair.privateKey;
    const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'int-test', alg: 'ES256' };
    db = await openDatabase({ url: databaseUrl, schema });
    expect(db.kind).toBe('postgres');
    stack = await startResourceStack({
      db,
      gatewayPort: 0,
      apiPort: 0,
      receiverPort: 0,
      baseUrl: audience,
      issuers: [{ issuer, jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
      relay: false,
    });
  });

  afterAll(async () => {
    await stack?.close();
    await db?.query(`drop schema if exists ${schema} cascade`);
    await db?.close();
  });

  const token = (sub = 'user-alice') =>
    new SignJWT({ scope: allScopes, client_id: 'photo-app' })
      .setProtectedHeader({ alg: 'ES256', kid: 'int-test', typ: 'at+jwt' })
      .setIssuer(issuer)
      .setSubject(sub)
      .setAudience(audience)
      .setIssuedAt()
      .setExpirationTime('5m')
      .setJti(randomUUID())
      .sign(privateKey);

  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const response = await fetch(new URL(path, stack.gateway.url), {
      method,
      headers: {
        authorization: `Bearer ${await token()}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        ...headers,
      },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await response.text();
    return { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : undefined };
  };

  it('keeps its tables in its own schema', async () => {
    const { rows } = await db.query<{ table_name: string }>(
      'select table_name from information_schema.tables where table_schema = $1',
      [schema],
    );
    expect(rows.map((row) => row.table_name)).toEqual(
      expect.arrayContaining(['api_charges', 'api_idempotency_records', 'api_webhook_outbox', 'receiver_events']),
    );
  });

  it('20 concurrent same-key charges: one charge row, one outbox row, the rest 409 or the replay', async () => {
    const key = `"${randomUUID()}"`;
    const responses = await Promise.all(
      Array.from({ length: 20 }, () =>
        call('POST', '/charges', { amount: 250, currency: 'EUR' }, { 'idempotency-key': key }),
      ),
    );
    expect(responses.every((response) => response.status === 201 || response.status === 409)).toBe(true);
    const created = responses.filter((response) => response.status === 201);
    expect(created.filter((response) => response.headers.get('idempotent-replayed') !== 'true')).toHaveLength(1);
    expect(new Set(created.map((response) => response.body.id)).size).toBe(1);
    const { rows } = await db.query<{ id: string }>('select id from api_charges where idempotency_key = $1', [
      key.slice(1, -1),
    ]);
    expect(rows).toHaveLength(1);
    const outbox = await db.query('select id from api_webhook_outbox where id = $1', [`evt_${rows[0]?.id}`]);
    expect(outbox.rows).toHaveLength(1);
  }, 60_000);

  it('a request with the key of a charge still running gets 409 with Retry-After, then the replay (part 3)', async () => {
    // Hold the first charge inside its handler: its insert waits for a lock another session holds.
    const blocker = new pg.Client({ connectionString: databaseUrl, options: `-c search_path=${schema}` });
    await blocker.connect();
    const key = `"${randomUUID()}"`;
    let first: Promise<Awaited<ReturnType<typeof call>>> | undefined;
    try {
      await blocker.query('begin');
      await blocker.query('lock table api_charges in exclusive mode');
      first = call('POST', '/charges', { amount: 4321, currency: 'EUR' }, { 'idempotency-key': key });
      // Wait until the first request is parked on the lock, which means it holds the key.
      for (let waiting = 0; waiting === 0; ) {
        const { rows } = await blocker.query<{ n: number }>(
          `select count(*)::int as n from pg_locks l join pg_class c on c.oid = l.relation
             join pg_namespace s on s.oid = c.relnamespace
            where c.relname = 'api_charges' and s.nspname = $1 and not l.granted`,
          [schema],
        );
        waiting = rows[0]?.n ?? 0;
      }
      const second = await call('POST', '/charges', { amount: 4321, currency: 'EUR' }, { 'idempotency-key': key });
      expect(second.status).toBe(409);
      expect(second.headers.get('retry-after')).toBeTruthy();
      expect(second.body).toMatchObject({ code: 'in_progress', retryable: true });
    } finally {
      await blocker.query('rollback').catch(() => undefined);
      await blocker.end();
    }
    const done = await first;
    expect(done?.status).toBe(201);
    const third = await call('POST', '/charges', { amount: 4321, currency: 'EUR' }, { 'idempotency-key': key });
    expect(third).toMatchObject({ status: 201, body: done?.body });
    expect(third.headers.get('idempotent-replayed')).toBe('true');
    const { rows } = await db.query('select id from api_charges where idempotency_key = $1', [key.slice(1, -1)]);
    expect(rows).toHaveLength(1);
  }, 60_000);

  it('same key with another amount is 422; a minted key comes back with the 201 and replays', async () => {
    const minted = await call('POST', '/charges', { amount: 999, currency: 'EUR' });
    expect(minted.status).toBe(201);
    const key = minted.headers.get('idempotency-key') as string;
    const replay = await call('POST', '/charges', { amount: 999, currency: 'EUR' }, { 'idempotency-key': key });
    expect(replay).toMatchObject({ status: 201, body: minted.body });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    const other = await call('POST', '/charges', { amount: 998, currency: 'EUR' }, { 'idempotency-key': key });
    expect(other.status).toBe(422);
  });

  it('the webhook is delivered, delivered again, and applied once', async () => {
    const charge = await call('POST', '/charges', { amount: 31, currency: 'EUR' });
    await stack.api.relayOnce();
    await db.query(`update api_webhook_outbox set status = 'pending', next_attempt_at = now() where id = $1`, [
      `evt_${charge.body.id}`,
    ]);
    await stack.api.relayOnce();
    const { rows } = await db.query<{ deliveries: number; applied: number }>(
      'select deliveries, applied from receiver_events where charge_id = $1',
      [charge.body.id],
    );
    expect(rows).toEqual([{ deliveries: 2, applied: 1 }]);
  });

  it('DELETE twice and PUT twice leave the same state', async () => {
    expect((await call('DELETE', '/photos/photo-alice-2')).status).toBe(204);
    expect((await call('DELETE', '/photos/photo-alice-2')).status).toBe(204);
    const photos = await call('GET', '/photos');
    expect(photos.body.photos.map((photo: { id: string }) => photo.id)).not.toContain('photo-alice-2');
    expect((await call('PUT', '/settings', { theme: 'dark' })).body).toEqual({ theme: 'dark' });
    expect((await call('PUT', '/settings', { theme: 'dark' })).body).toEqual({ theme: 'dark' });
    expect((await call('GET', '/settings')).body).toEqual({ theme: 'dark' });
  });

  it('a batch of 40 returns 40 levels', async () => {
    const items = Array.from({ length: 40 }, (_, index) => `item-${index + 1}`);
    const response = await call('POST', '/stock/batch', { items });
    expect(response.status).toBe(200);
    expect(response.body.levels).toHaveLength(40);
  });
});
