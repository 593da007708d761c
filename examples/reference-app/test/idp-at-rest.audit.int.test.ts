// Audit (branch audit-idphash): the bearer values the identity provider hands out, at rest. oidc-provider
// keys each stored model by its id, and for a refresh token, an authorization code, an opaque access
// token, a sign-in session or an interaction that id is the value the client or the browser presents.
// Whoever reads the database (a backup, a read replica, an SQL injection elsewhere) could use them.
import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { migrateIdp } from '../src/idp/schema.js';
import { loadCookieKeys } from '../src/idp/secrets.js';
import { storedId } from '../src/idp/stored-id.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { authorizationUrl, codeFlow, tokenRequest } from './flow.js';
import { openTestDatabase } from './services.js';
import { alice, resource, startTestIdp, type TestIdp } from './test-idp.js';
import { createUserAgent, decodeJwt, formAction, formField, pkcePair } from './user-agent.js';

let started: TestIdp;
let db: Database;
let running: RunningReferenceApp;

beforeAll(async () => {
  started = await startTestIdp('idp_at_rest');
  ({ db, running } = started);
}, 60_000);

afterAll(() => started?.close());

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

interface FixtureRow {
  model: string;
  id: string;
  payload: Record<string, unknown>;
  grant_id: string | null;
  uid: string | null;
  user_code: string | null;
  expires_in: number | null;
  consumed_ago: number | null;
  rotated_from: string | null;
  reused_ago: number | null;
}

const fixture = JSON.parse(
  readFileSync(new URL('./fixtures/upgrade/idp-models-b643e99.json', import.meta.url), 'utf8'),
) as {
  capturedAt: number;
  values: {
    code: string;
    usedRefreshToken: string;
    refreshToken: string;
    accessTokens: string[];
    sessionCookie: string;
    interactions: string[];
    earlierSessionCookies: string[];
  };
  rows: FixtureRow[];
};
const { values } = fixture;
const cli = { clientId: 'cli-pkce', redirectUri: 'http://127.0.0.1:4321/callback' };

/** The epoch times oidc-provider keeps in a payload: moved by the time since the capture. */
const epochFields = ['iat', 'exp', 'iiat', 'authTime', 'loginTs', 'consumed'];

/**
 * The fixture's rows stored in `db`, as the earlier version left them: under their ids, in a table
 * without the record of the upgrade (`idp_upgrades`, which that version did not have). Their times
 * are moved to now, as if the capture had just been made.
 */
async function storeRowsOfEarlierVersion(db: Database) {
  await migrateIdp(db);
  await db.query('drop table idp_upgrades');
  const shift = Math.floor(Date.now() / 1000) - fixture.capturedAt;
  for (const row of fixture.rows) {
    const payload = { ...row.payload };
    for (const field of epochFields) if (typeof payload[field] === 'number') payload[field] += shift;
    await db.query(
      `insert into idp_models (model, id, payload, grant_id, uid, user_code, expires_at, consumed_at, rotated_from, reused_at)
       values ($1, $2, $3, $4, $5, $6,
         now() + make_interval(secs => $7), now() - make_interval(secs => $8), $9, now() - make_interval(secs => $10))`,
      [
        row.model,
        row.id,
        JSON.stringify(payload),
        row.grant_id,
        row.uid,
        row.user_code,
        row.expires_in,
        row.consumed_ago,
        row.rotated_from,
        row.reused_ago,
      ],
    );
  }
}

/** A database holding the earlier version's rows, and this version started on it. */
async function upgraded(name: string) {
  const db = await openTestDatabase(name);
  await storeRowsOfEarlierVersion(db);
  const running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: resource });
  return {
    db,
    running,
    async close() {
      await running.close();
      await db.close();
    },
  };
}

/** The signature oidc-provider's cookies carry (Keygrip: HMAC-SHA1, base64url), by the first key. */
const cookieSignature = (key: string, name: string, value: string) =>
  createHmac('sha1', key).update(`${name}=${value}`).digest('base64url');

describe('rows an earlier version stored under the ids themselves', () => {
  // The upgrade path of the fix above: the rows are rewritten once at start, not left unreachable.
  it('a refresh token issued before the upgrade refreshes after it, and a session cookie from before still signs in', async () => {
    const { db, running, close } = await upgraded('idp_upgrade_use');
    try {
      const refreshed = await tokenRequest(
        running.authUrl,
        { grant_type: 'refresh_token', refresh_token: values.refreshToken },
        cli,
      );
      expect(refreshed.status, JSON.stringify(refreshed.body)).toBe(200);
      expect(decodeJwt(refreshed.body.id_token).payload.sub).toBe('user-alice');
      expect(
        (
          await tokenRequest(
            running.authUrl,
            { grant_type: 'refresh_token', refresh_token: refreshed.body.refresh_token },
            cli,
          )
        ).status,
      ).toBe(200);

      // The browser's cookie, signed by this database's keys (which the fixture does not carry).
      const [key] = await loadCookieKeys(db);
      const agent = createUserAgent();
      const url = new URL(running.authUrl);
      for (const [name, value] of [
        ['_session', values.sessionCookie],
        ['_session.sig', cookieSignature(key!, '_session', values.sessionCookie)],
      ] as const) {
        agent.jar.cookies.set(name, { value, raw: `${name}=${value}; path=/; domain=${url.hostname}` });
      }
      const { verifier, challenge } = pkcePair();
      const start = authorizationUrl(running.authUrl, {
        clientId: cli.clientId,
        redirectUri: cli.redirectUri,
        scope: 'openid',
        challenge,
        challengeMethod: 'S256',
      });
      const page = await agent.follow(start, (next) => next.startsWith(cli.redirectUri));
      // Signed in already: the consent page, not the login page.
      expect(page.body).toContain('<h1>Allow access</h1>');
      const consent = await agent.postForm(new URL(formAction(page.body, 'consent'), running.authUrl).href, {
        csrf: formField(page.body, 'csrf'),
      });
      const back = await agent.follow(
        new URL(consent.response.headers.get('location')!, running.authUrl).href,
        (next) => next.startsWith(cli.redirectUri),
      );
      const code = new URL(back.url).searchParams.get('code');
      const tokens = await tokenRequest(
        running.authUrl,
        { grant_type: 'authorization_code', code: code!, redirect_uri: cli.redirectUri, code_verifier: verifier },
        cli,
      );
      expect(tokens.status).toBe(200);
      expect(decodeJwt(tokens.body.id_token).payload.sub).toBe('user-alice');
    } finally {
      await close();
    }
  });

  // The reuse interval follows `rotated_from`, which names the used token: rewritten too.
  it('a refresh token used just before the upgrade is answered once more after it, and supersedes the token it was rotated to', async () => {
    const { running, close } = await upgraded('idp_upgrade_reuse');
    try {
      const refresh = (token: string) =>
        tokenRequest(running.authUrl, { grant_type: 'refresh_token', refresh_token: token }, cli);
      const again = await refresh(values.usedRefreshToken);
      expect(again.status, JSON.stringify(again.body)).toBe(200);
      expect((await refresh(values.refreshToken)).body.error).toBe('invalid_grant');
    } finally {
      await close();
    }
  });

  it('keeps none of their bearer values once started, and later starts, at once, rewrite nothing again', async () => {
    const { db, close } = await upgraded('idp_upgrade_rows');
    try {
      const held = {
        code: [values.code],
        refreshTokens: [values.usedRefreshToken, values.refreshToken],
        accessTokens: values.accessTokens,
        sessionCookies: [values.sessionCookie, ...values.earlierSessionCookies],
        interactions: values.interactions,
      };
      expect(foundIn(await everyRow(db), held)).toEqual([]);
      const stored = async () =>
        (
          await db.query<{ row: string }>(
            'select (model, id, payload, rotated_from)::text as row from idp_models order by model, id',
          )
        ).rows.map((one) => one.row);
      const before = await stored();
      expect(before.some((row) => row.includes(storedId('RefreshToken', values.refreshToken)))).toBe(true);
      await Promise.all([migrateIdp(db), migrateIdp(db)]);
      expect(await stored()).toEqual(before);
    } finally {
      await close();
    }
  });

  // The rewrite is one transaction: a start that fails in it (here a row in the way of a rewritten
  // one, as a start killed midway would fail) leaves every row as the earlier version stored it, and
  // the next start does it all.
  it('a rewrite that fails midway leaves every row as it was, for the next start to do', async () => {
    const db = await openTestDatabase('idp_upgrade_fail');
    try {
      await storeRowsOfEarlierVersion(db);
      await db.query(`insert into idp_models (model, id, payload) values ('RefreshToken', $1, '{}')`, [
        storedId('RefreshToken', values.refreshToken),
      ]);
      const asStored = async () =>
        (await db.query<{ row: string }>('select m::text as row from idp_models m order by model, id')).rows.map(
          (one) => one.row,
        );
      const before = await asStored();
      await expect(migrateIdp(db)).rejects.toMatchObject({ code: '23505' });
      expect(await asStored()).toEqual(before);
      await db.query(`delete from idp_models where model = 'RefreshToken' and payload = '{}'`);
      await migrateIdp(db);
      expect(foundIn(await everyRow(db), { refreshToken: [values.refreshToken] })).toEqual([]);
    } finally {
      await db.close();
    }
  });
});
