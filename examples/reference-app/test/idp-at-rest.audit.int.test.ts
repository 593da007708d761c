// Audit (branch audit-idphash): the bearer values the identity provider hands out, at rest. oidc-provider
// keys each stored model by its id, and for a refresh token, an authorization code, an opaque access
// token, a sign-in session or an interaction that id is the value the client or the browser presents.
// Whoever reads the database (a backup, a read replica, an SQL injection elsewhere) could use them.
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { demoUsers } from '../src/seed.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { codeFlow, tokenRequest } from './flow.js';
import { openTestDatabase } from './services.js';

const resource = 'http://localhost:8080';
const alice = { username: 'alice', password: demoUsers[0].password };

let db: Database;
let running: RunningReferenceApp;

beforeAll(async () => {
  db = await openTestDatabase('idp_at_rest');
  running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: resource });
}, 60_000);

afterAll(async () => {
  await running?.close();
  await db?.close();
});

/** Each of `values` found in a row of `rows`, said as `what in row`: none is what every test wants. */
function foundIn(rows: string[], held: Record<string, readonly unknown[]>): string[] {
  return Object.entries(held).flatMap(([what, values]) =>
    values.flatMap((value) => rows.filter((row) => row.includes(value as string)).map((row) => `${what} in ${row}`)),
  );
}

/** Every row of every table the app made, as text: whichever column (or key of a payload) a value is in. */
async function everyRow(db: Database): Promise<string[]> {
  const { rows: tables } = await db.query<{ name: string }>(
    `select quote_ident(table_name) as name from information_schema.tables
     where table_schema = current_schema() and table_type = 'BASE TABLE'`,
  );
  expect(tables.map((table) => table.name)).toContain('idp_models');
  const rows: string[] = [];
  for (const { name } of tables) {
    const { rows: found } = await db.query<{ row: string }>(`select t::text as row from ${name} t`);
    rows.push(...found.map((one) => `${name}: ${one.row}`));
  }
  return rows;
}

// Was wrong: each of them was the primary key of its row in idp_models, and repeated in the row's
// payload (`jti`); an interaction started by a signed-in browser kept its session cookie in its payload
// (`session.cookie`), and each interaction its own id in `returnTo`. Now the rows are keyed by a
// SHA-256 of the id, as the app's own sessions are (`id_hash`), and the payloads keep no copy.
it('keeps no refresh token, code, opaque access token, session cookie or interaction id a client or browser holds', async () => {
  const cli = { clientId: running.clients.publicClient.clientId, redirectUri: 'http://127.0.0.1:4321/callback' };
  // No API scope: the access tokens are opaque, stored ones.
  const scope = 'openid offline_access';
  const first = await codeFlow(running.authUrl, cli, alice, { scope });
  expect(first.tokens.status).toBe(200);
  // A second sign-in in the same browser: its interaction starts with the session signed in.
  const second = await codeFlow(running.authUrl, cli, alice, { scope }, first.agent);
  expect(second.tokens.status).toBe(200);
  const refreshed = await tokenRequest(
    running.authUrl,
    { grant_type: 'refresh_token', refresh_token: second.tokens.body.refresh_token },
    cli,
  );
  expect(refreshed.status).toBe(200);
  const held = {
    codes: [first.callback.searchParams.get('code'), second.callback.searchParams.get('code')],
    refreshTokens: [first.tokens.body.refresh_token, second.tokens.body.refresh_token, refreshed.body.refresh_token],
    accessTokens: [first.tokens.body.access_token, second.tokens.body.access_token, refreshed.body.access_token],
    sessionCookie: [first.agent.jar.cookies.get('_session')?.value],
    interactionCookie: [first.agent.jar.cookies.get('_interaction')?.value],
  };
  for (const values of Object.values(held)) {
    for (const value of values) expect(typeof value === 'string' && value.length >= 20).toBe(true);
  }
  const rows = await everyRow(db);
  expect(rows.some((row) => row.startsWith('idp_models: (RefreshToken,'))).toBe(true);
  expect(foundIn(rows, held)).toEqual([]);
});
