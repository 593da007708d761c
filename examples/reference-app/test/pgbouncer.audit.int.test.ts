// Audit (branch audit-pgbouncer): the reference app's PostgreSQL mode through a real PgBouncer in
// transaction mode, 3 server connections for the whole app: the identity provider's code flow and
// refresh rotation, concurrent same-key charges (claims, charge transactions, outbox rows), and the
// relay. PgBouncer refuses pg's `options` startup parameter, so the app's `schema` option (which sets
// search_path through it) cannot be used: the app connects as a role of its own whose search_path is
// its own schema, set with ALTER ROLE, the way a deployment behind a pooler does it.
import { randomBytes, randomUUID } from 'node:crypto';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type PgBouncer,
  pgBouncerAvailable,
  startPgBouncer,
} from '../../../packages/testkit/test/audit-support/pgbouncer.js';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import { type Database, openDatabase } from '../src/db.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { codeFlow, tokenRequest } from './flow.js';
import { alice } from './test-idp.js';
import { allScopes } from './test-stack.js';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const available =
  serviceAvailable(
    `PostgreSQL at ${databaseUrl}`,
    await postgresAnswers(databaseUrl),
    'the reference app PgBouncer audit',
  ) && pgBouncerAvailable('the reference app PgBouncer audit');

const name = `refapp_pgb_${randomBytes(4).toString('hex')}`;
const issuer = 'https://issuer.pgb-audit.example';
const audience = 'http://gateway.pgb-audit';

describe.runIf(available)('the reference app on PostgreSQL through PgBouncer (transaction mode)', () => {
  const admin = new pg.Pool({ connectionString: databaseUrl, max: 1 });
  admin.on('error', () => undefined);
  let bouncer: PgBouncer;
  let db: Database;
  let stack: RunningResourceStack;
  let running: RunningReferenceApp;
  let privateKey: CryptoKey;

  beforeAll(async () => {
    await admin.query(`CREATE ROLE ${name} LOGIN`);
    await admin.query(`CREATE SCHEMA ${name} AUTHORIZATION ${name}`);
    await admin.query(`ALTER ROLE ${name} SET search_path = ${name}`);
    bouncer = await startPgBouncer({ databaseUrl, poolMode: 'transaction', poolSize: 3, users: [name] });
    const url = new URL(bouncer.url);
    url.username = name;
    db = await openDatabase({ url: url.toString() });
    const pair = await generateKeyPair('ES256');
    privateKey = pair.privateKey;
    const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'pgb', alg: 'ES256' };
    stack = await startResourceStack({
      db,
      gatewayPort: 0,
      apiPort: 0,
      receiverPort: 0,
      baseUrl: audience,
      issuers: [{ issuer, jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
      relay: false,
    });
    running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: 'http://localhost:8080' });
  }, 60_000);

  afterAll(async () => {
    await running?.close();
    await stack?.close();
    await db?.close();
    await bouncer?.stop();
    await admin.query(`DROP SCHEMA IF EXISTS ${name} CASCADE`);
    await admin.query(`DROP ROLE IF EXISTS ${name}`);
    await admin.end();
  });

  const call = async (path: string, body: unknown, headers: Record<string, string> = {}) => {
    const token = await new SignJWT({ scope: allScopes, client_id: 'photo-app' })
      .setProtectedHeader({ alg: 'ES256', kid: 'pgb', typ: 'at+jwt' })
      .setIssuer(issuer)
      .setSubject('user-alice')
      .setAudience(audience)
      .setIssuedAt()
      .setExpirationTime('5m')
      .setJti(randomUUID())
      .sign(privateKey);
    const response = await fetch(new URL(path, stack.gateway.url), {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
    });
    const text = await response.text();
    return { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : undefined };
  };

  it('keeps its tables in the role’s schema', async () => {
    const { rows } = await admin.query('SELECT table_name FROM information_schema.tables WHERE table_schema = $1', [
      name,
    ]);
    expect(rows.map((row) => row.table_name)).toEqual(
      expect.arrayContaining(['api_charges', 'api_idempotency_records', 'api_webhook_outbox', 'idp_models']),
    );
  });

  it('20 concurrent same-key charges: one charge, one outbox row, the rest 409 or the replay; the relay delivers it', async () => {
    const key = `"${randomUUID()}"`;
    const responses = await Promise.all(
      Array.from({ length: 20 }, () => call('/charges', { amount: 250, currency: 'EUR' }, { 'idempotency-key': key })),
    );
    expect(responses.map((response) => response.status).filter((status) => status !== 201 && status !== 409)).toEqual(
      [],
    );
    const created = responses.filter((response) => response.status === 201);
    expect(created.filter((response) => response.headers.get('idempotent-replayed') !== 'true')).toHaveLength(1);
    const { rows } = await db.query<{ id: string }>('SELECT id FROM api_charges WHERE idempotency_key = $1', [
      key.slice(1, -1),
    ]);
    expect(rows).toHaveLength(1);
    await stack.api.relayOnce();
    const applied = await db.query<{ applied: number }>('SELECT applied FROM receiver_events WHERE charge_id = $1', [
      rows[0]?.id,
    ]);
    expect(applied.rows).toEqual([{ applied: 1 }]);
  }, 60_000);

  it('runs the code flow and refresh rotation on the identity provider', async () => {
    const app = running.clients.app;
    const { tokens } = await codeFlow(running.authUrl, app, alice);
    expect(tokens.status).toBe(200);
    const rotated = await tokenRequest(
      running.authUrl,
      { grant_type: 'refresh_token', refresh_token: tokens.body.refresh_token as string },
      app,
    );
    expect(rotated.status).toBe(200);
  }, 60_000);
});
