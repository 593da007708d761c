// The identity provider and the third-party app on a real PostgreSQL (DATABASE_URL) instead of
// PGlite: the same adapter SQL, sessions and keys, in a schema of their own that is dropped afterwards.
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createSessionStore } from '../src/app/sessions.js';
import { type Database, openDatabase } from '../src/db.js';
import { storedId } from '../src/idp/stored-id.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { codeFlow, loginAndConsent, signOutOfApp, tokenRequest } from './flow.js';
import { alice } from './test-idp.js';
import { createUserAgent, decodeJwt } from './user-agent.js';

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';

async function reachable(): Promise<boolean> {
  const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: 3000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.query('select 1');
    return true;
  } catch (error) {
    if (process.env.CI === 'true')
      throw new Error(`PostgreSQL at ${databaseUrl} is unreachable and CI=true`, { cause: error });
    console.warn(`\n*** SKIPPING reference-app PostgreSQL tests: ${databaseUrl} is unreachable ***\n`);
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}

const available = await reachable();
const schema = `refapp_${randomBytes(6).toString('hex')}`;
const resource = 'http://localhost:8080';

describe.runIf(available)('reference app on PostgreSQL', () => {
  let db: Database;
  let running: RunningReferenceApp;

  beforeAll(async () => {
    db = await openDatabase({ url: databaseUrl, schema });
    expect(db.kind).toBe('postgres');
    running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: resource });
  });

  afterAll(async () => {
    await running?.close();
    await db?.query(`drop schema if exists ${schema} cascade`);
    await db?.close();
  });

  it('keeps its tables in its own schema', async () => {
    const { rows } = await db.query<{ table_name: string }>(
      'select table_name from information_schema.tables where table_schema = $1 order by table_name',
      [schema],
    );
    expect(rows.map((row) => row.table_name)).toEqual(
      expect.arrayContaining(['app_sessions', 'idp_models', 'idp_secrets', 'idp_users']),
    );
  });

  it('runs the code flow, rotation and reuse detection, and code reuse refusal', async () => {
    const app = running.clients.app;
    const { callback, verifier, tokens } = await codeFlow(running.authUrl, app, alice);
    expect(tokens.status).toBe(200);
    expect(decodeJwt(tokens.body.access_token).payload.aud).toBe(resource);

    const again = await tokenRequest(
      running.authUrl,
      {
        grant_type: 'authorization_code',
        code: callback.searchParams.get('code')!,
        redirect_uri: app.redirectUri,
        code_verifier: verifier,
      },
      app,
    );
    expect(again.body.error).toBe('invalid_grant');

    const second = await codeFlow(running.authUrl, app, alice);
    const rt1 = second.tokens.body.refresh_token as string;
    const rotated = await tokenRequest(running.authUrl, { grant_type: 'refresh_token', refresh_token: rt1 }, app);
    expect(rotated.status).toBe(200);
    const rt2 = rotated.body.refresh_token as string;
    expect(rt2).not.toBe(rt1);
    // Past the reuse interval (within it, a retry is answered once more: `refresh-reuse.int.test.ts`).
    await db.query(
      `update idp_models set consumed_at = consumed_at - interval '1 hour' where model = 'RefreshToken' and id = $1`,
      [storedId('RefreshToken', rt1)],
    );
    expect(
      (await tokenRequest(running.authUrl, { grant_type: 'refresh_token', refresh_token: rt1 }, app)).body.error,
    ).toBe('invalid_grant');
    expect(
      (await tokenRequest(running.authUrl, { grant_type: 'refresh_token', refresh_token: rt2 }, app)).body.error,
    ).toBe('invalid_grant');
  });

  it('signs in to the third-party app and revokes on sign-out', async () => {
    const agent = createUserAgent();
    const callback = await loginAndConsent(
      agent,
      running.authUrl,
      new URL('/signin', running.appUrl).href,
      new URL('/callback', running.appUrl).href,
      alice,
    );
    await agent.request(callback.href);
    const page = await agent.request(new URL('/', running.appUrl).href);
    expect(page.body).toContain('Alice Liddell');
    const id = agent.jar.cookies.get('app_session')?.value;
    const stored = await createSessionStore(db, { ttlSeconds: 60 }).get(id);
    const csrf = /name="csrf" value="([^"]+)"/.exec(page.body)?.[1] ?? '';
    const out = await signOutOfApp(agent, running.appUrl, csrf);
    expect(out.body).toContain('You are signed out.');
    const refresh = await tokenRequest(
      running.authUrl,
      { grant_type: 'refresh_token', refresh_token: stored!.tokens!.refreshToken! },
      running.clients.app,
    );
    expect(refresh.body.error).toBe('invalid_grant');
  });
});
