// The app's session rows keep the OAuth tokens sealed with a key derived from the session id, which
// only the browser's cookie holds (sessions.ts, sealed-tokens.ts): a database dump, a replica or a
// read-only SQL injection gets no token to present at the provider or the API. Each test on the
// embedded PGlite, and on PostgreSQL when DATABASE_URL is set.
import { randomBytes, randomUUID } from 'node:crypto';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { migrateApp } from '../src/app/schema.js';
import { openTokens, sealTokens } from '../src/app/sealed-tokens.js';
import { createSessionStore, type SessionTokens } from '../src/app/sessions.js';
import type { Database } from '../src/db.js';
import { introspect } from './flow.js';
import { openTestDatabaseTwice, type TwoHandles } from './services.js';
import { hashOf, startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { formField } from './user-agent.js';

const random = () => randomBytes(32).toString('base64url');
const tokensOf = (): SessionTokens => ({
  accessToken: `access-${random()}`,
  refreshToken: `refresh-${random()}`,
  expiresAt: Date.now() + 3600_000,
  scope: 'openid photos:read',
});

/** The session row as text, every column: whatever a reader of the database sees of it. */
const rowText = async (db: Database, id: string) =>
  (
    await db.query<{ row: string }>('select row_to_json(s)::text as row from app_sessions s where id_hash = $1', [
      hashOf(id),
    ])
  ).rows[0]?.row;
const rowData = async (db: Database, id: string) =>
  (await db.query<{ data: Record<string, unknown> }>('select data from app_sessions where id_hash = $1', [hashOf(id)]))
    .rows[0]?.data;

describe('sealTokens and openTokens', () => {
  const id = random();
  const tokens = tokensOf();

  it('opens what it sealed, for that id and row only', () => {
    const sealed = sealTokens(id, hashOf(id), tokens);
    expect(openTokens(id, hashOf(id), sealed)).toEqual(tokens);
    const other = random();
    expect(openTokens(other, hashOf(other), sealed)).toBeUndefined();
    // The right key on another row: the AAD names the row.
    expect(openTokens(id, hashOf(other), sealed)).toBeUndefined();
  });

  it('uses a fresh IV for every seal', () => {
    const first = sealTokens(id, hashOf(id), tokens);
    const second = sealTokens(id, hashOf(id), tokens);
    expect(first.iv).not.toBe(second.iv);
    expect(first.ct).not.toBe(second.ct);
  });

  it.each([
    ['a changed byte', (ct: string) => `${ct.slice(0, 5)}${ct[5] === 'A' ? 'B' : 'A'}${ct.slice(6)}`],
    ['a cut tag', (ct: string) => ct.slice(0, -4)],
    ['nothing', () => ''],
    ['not base64url', () => '%%%'],
  ])('opens nothing from a ciphertext with %s, and does not throw', (_name, alter) => {
    const sealed = sealTokens(id, hashOf(id), tokens);
    expect(openTokens(id, hashOf(id), { ...sealed, ct: alter(sealed.ct) })).toBeUndefined();
  });

  it.each([null, 'text', 42, {}, { v: 1 }, { v: 1, iv: 1, ct: 2 }])('opens nothing from %j', (value) => {
    expect(openTokens(id, hashOf(id), value)).toBeUndefined();
  });
});

const stores: Array<[string, () => Promise<TwoHandles>]> = [
  ['the embedded PGlite', () => openTestDatabaseTwice('sealed_store', { embedded: true })],
];
if (process.env.DATABASE_URL) stores.push(['PostgreSQL', () => openTestDatabaseTwice('sealed_store')]);

describe.each(stores)('session tokens at rest on %s', (_name, open) => {
  let dbs: TwoHandles;
  let db: Database;
  beforeAll(async () => {
    dbs = await open();
    db = dbs.one;
    await migrateApp(db);
  }, 60_000);
  afterAll(async () => {
    await dbs?.close();
  });

  const store = () => createSessionStore(db, { ttlSeconds: 3600 });
  const refresh = async (id: string, tokens: SessionTokens) => {
    const claim = randomUUID();
    expect(await store().claimRefresh(id, claim)).toBeDefined();
    expect(await store().finishRefresh(id, claim, { tokens })).toBe(true);
  };

  // Was wrong: the row's `data` held the access and refresh tokens in clear, next to a hash of the
  // id: the table alone handed out every signed-in user's refresh token.
  it('keeps no token text in the row, from the sign-in or a refresh, and gives the tokens back with the id', async () => {
    const first = tokensOf();
    const id = await store().create({ user: { sub: 'alice', name: 'Alice' }, tokens: first });
    let text = await rowText(db, id);
    expect(text).toBeDefined();
    expect(text).not.toContain(first.accessToken);
    expect(text).not.toContain(first.refreshToken);
    expect(await rowData(db, id)).not.toHaveProperty('tokens');
    expect(await store().get(id)).toEqual({ user: { sub: 'alice', name: 'Alice' }, tokens: first });

    const second = tokensOf();
    await refresh(id, second);
    text = await rowText(db, id);
    for (const token of [first.accessToken, first.refreshToken, second.accessToken, second.refreshToken])
      expect(text).not.toContain(token);
    expect((await store().get(id))?.tokens).toEqual(second);
    expect((await store().take(id))?.tokens).toEqual(second);
  });

  it("does not open one row's seal copied into another: that session is over, its row gone", async () => {
    const victim = await store().create({ user: { sub: 'alice' }, tokens: tokensOf() });
    const reader = await store().create({ user: { sub: 'mallory' }, tokens: tokensOf() });
    await db.query(
      `update app_sessions set data = jsonb_set(data, '{sealed}', (select data -> 'sealed' from app_sessions where id_hash = $2))
        where id_hash = $1`,
      [hashOf(reader), hashOf(victim)],
    );
    expect(await store().get(reader)).toBeUndefined();
    expect(await rowData(db, reader)).toBeUndefined();
    expect((await store().get(victim))?.user).toEqual({ sub: 'alice' });
  });

  it('keeps the row when a refresh sealed new tokens between the read of a broken seal and its delete', async () => {
    const id = await store().create({ user: { sub: 'alice' }, tokens: tokensOf() });
    await db.query(`update app_sessions set data = jsonb_set(data, '{sealed,ct}', '"AAAA"') where id_hash = $1`, [
      hashOf(id),
    ]);
    const fresh = tokensOf();
    // The concurrent refresh's write lands just before the delete of the broken seal is sent.
    const racing: Database = {
      ...db,
      query: async <Row>(text: string, params: readonly unknown[] = []) => {
        if (text.startsWith('delete from app_sessions where id_hash = $1 and')) {
          await db.query(`update app_sessions set data = jsonb_set(data, '{sealed}', $2::jsonb) where id_hash = $1`, [
            hashOf(id),
            JSON.stringify(sealTokens(id, hashOf(id), fresh)),
          ]);
        }
        return db.query<Row>(text, params);
      },
    };
    expect(await createSessionStore(racing, { ttlSeconds: 3600 }).get(id)).toBeUndefined();
    expect((await store().get(id))?.tokens).toEqual(fresh);
  });

  it('gives nothing to revoke, and throws nothing, for a seal that does not open', async () => {
    const id = await store().create({ user: { sub: 'alice' }, tokens: tokensOf() });
    await db.query(`update app_sessions set data = jsonb_set(data, '{sealed,ct}', '"AAAA"') where id_hash = $1`, [
      hashOf(id),
    ]);
    expect(await store().claimRefresh(id, randomUUID())).toBeUndefined();
    const ended = await store().create({ user: { sub: 'bob' }, tokens: tokensOf() });
    await db.query(`update app_sessions set data = jsonb_set(data, '{sealed,iv}', '"x"') where id_hash = $1`, [
      hashOf(ended),
    ]);
    expect(await store().take(ended)).toEqual({ user: { sub: 'bob' } });
  });

  it('reads a row an earlier version wrote with its tokens in clear, and seals them at its next refresh', async () => {
    const old = tokensOf();
    const id = await store().create({ user: { sub: 'alice' } });
    await db.query('update app_sessions set data = $2::jsonb where id_hash = $1', [
      hashOf(id),
      JSON.stringify({ user: { sub: 'alice' }, tokens: old }),
    ]);
    expect(await store().get(id)).toEqual({ user: { sub: 'alice' }, tokens: old });
    const renewed = tokensOf();
    await refresh(id, renewed);
    const data = await rowData(db, id);
    expect(data).not.toHaveProperty('tokens');
    expect(data).toHaveProperty('sealed');
    expect(await rowText(db, id)).not.toContain(renewed.refreshToken);
    expect(await store().get(id)).toEqual({ user: { sub: 'alice' }, tokens: renewed });
  });

  // During a rolling deploy: an earlier version reads `data.tokens`, which a sealed row does not have.
  // It takes the session for signed out (it clears the cookie, revokes nothing). A later version's
  // seal is the same to this one: no tokens, and the row is left to the process that can read it.
  it('leaves a row sealed in a format it does not know, with no tokens for this process', async () => {
    const id = await store().create({ user: { sub: 'alice' }, tokens: tokensOf() });
    await db.query(`update app_sessions set data = jsonb_set(data, '{sealed,v}', '2') where id_hash = $1`, [
      hashOf(id),
    ]);
    expect(await store().get(id)).toEqual({ user: { sub: 'alice' } });
    expect(await rowData(db, id)).toHaveProperty('sealed.v', 2);
  });
});

const stacks: Array<[string, boolean]> = [['the embedded PGlite', true]];
if (process.env.DATABASE_URL) stacks.push(['PostgreSQL', false]);

describe.each(stacks)('the app with sealed session tokens, on %s', (_name, embedded) => {
  let stack: TwoAppStack;
  let revocations = 0;
  /** How far the apps' clock is ahead of the real one (ms): an access token expires without a wait. */
  let ahead = 0;
  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'sealed_http',
      embedded,
      now: () => Date.now() + ahead,
      authMiddleware: (provider) => (req, res) => {
        if (req.method === 'POST' && req.url?.startsWith('/token/revocation')) revocations++;
        provider(req, res);
      },
    });
  }, 120_000);
  afterAll(async () => {
    await stack?.close();
  });
  beforeEach(() => {
    revocations = 0;
    ahead = 0;
  });

  const signOut = (cookie: string, csrf: string) =>
    fetch(new URL('/signout', stack.appUrls[0]).href, {
      method: 'POST',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ csrf }),
      redirect: 'manual',
    });

  it('signs in, refreshes on the other process and signs out, with the tokens never in the row', async () => {
    const { id, tokens, agent } = await stack.signIn();
    expect(await rowText(stack.dbs.one, id)).not.toContain(tokens.refreshToken);
    ahead = tokens.expiresAt - Date.now();
    const page = await stack.page(1, agent.jar.header());
    expect(page.body).toContain('Alice');
    const refreshed = (await stack.sessions().get(id))?.tokens;
    expect(refreshed?.refreshToken).not.toBe(tokens.refreshToken);
    expect(await rowText(stack.dbs.one, id)).not.toContain(refreshed!.refreshToken);
    const csrf = formField((await agent.request(new URL('/', stack.appUrls[0]).href)).body, 'csrf');
    expect((await signOut(agent.jar.header(), csrf)).status).toBe(303);
    expect(revocations).toBe(2);
    expect((await introspect(stack.authUrl, refreshed!.refreshToken!, stack.client)).active).toBe(false);
  });

  it('answers a session whose seal does not open as signed out, not a 500, and revokes nothing', async () => {
    const { id, agent } = await stack.signIn();
    await stack.dbs.one.query(
      `update app_sessions set data = jsonb_set(data, '{sealed,ct}', '"AAAA"') where id_hash = $1`,
      [hashOf(id)],
    );
    revocations = 0;
    const page = await agent.request(new URL('/', stack.appUrls[1]).href);
    expect(page.response.status).toBe(200);
    expect(page.body).not.toContain('Alice');
    expect(page.body).toContain('Sign in');
    // Its cookie goes, as a signed-out session's does.
    expect(page.response.headers.get('set-cookie')).toMatch(/app_session=;/);
    expect(revocations).toBe(0);
    expect(await rowData(stack.dbs.one, id)).toBeUndefined();
  });

  it('keeps serving a session an earlier version wrote in clear, and seals it at its refresh', async () => {
    const { id, tokens, agent } = await stack.signIn();
    const data = await stack.sessions().get(id);
    await stack.dbs.one.query('update app_sessions set data = $2::jsonb where id_hash = $1', [
      hashOf(id),
      JSON.stringify(data),
    ]);
    expect(await rowText(stack.dbs.one, id)).toContain(tokens.refreshToken);
    expect((await stack.page(0, agent.jar.header())).body).toContain('Alice');
    ahead = tokens.expiresAt - Date.now();
    expect((await stack.page(1, agent.jar.header())).body).toContain('Alice');
    const after = await rowData(stack.dbs.one, id);
    expect(after).not.toHaveProperty('tokens');
    const refreshed = (await stack.sessions().get(id))?.tokens;
    expect(refreshed?.refreshToken).not.toBe(tokens.refreshToken);
    const text = await rowText(stack.dbs.one, id);
    expect(text).not.toContain(tokens.refreshToken);
    expect(text).not.toContain(refreshed!.refreshToken);
  });
});
