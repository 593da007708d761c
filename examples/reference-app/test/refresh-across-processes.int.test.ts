// A session's tokens are refreshed one at a time across app processes, not only within one. The
// provider rotates refresh tokens: a second use of a spent one is reuse, and revokes the whole grant
// (the user is signed out everywhere). Two processes behind one load balancer serve one session (its
// row is in the shared database): each refreshing on its own would present the same refresh token
// twice. Here the app runs twice on one database (two pools on PostgreSQL, as two processes have;
// the one PGlite for the embedded store), each with its own in-process state, and the provider with
// no reuse interval (`refreshTokenReuseSeconds: 0`), so a second use revokes at once.
//
// The first refresh's request is held at the provider until the other process has either sent its
// own (the defect) or is seen waiting (it keeps reading the session row), so the two overlap every
// run, not by luck of timing.
import { createHash } from 'node:crypto';
import type { RequestListener } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateApp } from '../src/app/schema.js';
import { createThirdPartyApp } from '../src/app/server.js';
import { createSessionStore, refreshLeaseSeconds, type SessionTokens } from '../src/app/sessions.js';
import type { Database } from '../src/db.js';
import { createIdp } from '../src/idp/server.js';
import { storedId } from '../src/idp/stored-id.js';
import { type ListeningPort, listen } from '../src/listen.js';
import { seed } from '../src/seed.js';
import { introspect, loginAndConsent } from './flow.js';
import { openTestDatabaseTwice, type TwoHandles } from './services.js';
import { alice } from './test-idp.js';
import { createUserAgent } from './user-agent.js';

/** Pages of one session sent at once, half to each process. */
const callers = 10;

const hashOf = (id: string) => createHash('sha256').update(id).digest('base64url');

/** Resolves after `ms`, or rejects after it when `reason` is given (a bound on a wait that must end). */
const after = (ms: number, reason?: string) =>
  new Promise<never>((resolve, reject) =>
    setTimeout(() => (reason === undefined ? resolve(undefined as never) : reject(new Error(reason))), ms),
  );

const stores: Array<[string, boolean]> = [['the embedded PGlite', true]];
if (process.env.DATABASE_URL) stores.push(['PostgreSQL, through two pools', false]);

describe.each(stores)('a session refreshed by two app processes at once, on %s', (_name, embedded) => {
  let dbs: TwoHandles;
  const ports: ListeningPort[] = [];
  let authUrl: string;
  let appUrls: [string, string];
  let client: { clientId: string; clientSecret: string };
  /** The app's clock, ahead of the real one by this much (both processes share it). */
  let clock = 0;
  /** Access tokens each process sent to the API, by process. */
  const sentTokens: [string[], string[]] = [[], []];

  /** The provider's token requests while `hold` is set: the first waits for `hold.release`. */
  let hold: { first: () => void; second: () => void; released: Promise<void>; taken: boolean } | undefined;
  /** The token endpoint drops every connection while this is set. */
  let unreachable = false;
  /** The provider's database refuses every statement while this is set (it answers 500 server_error). */
  let providerDatabaseDown = false;
  /** Statements the second process ran on the watched session row. */
  let watched: { hash: string; count: number } | undefined;

  beforeAll(async () => {
    dbs = await openTestDatabaseTwice('refresh_lock', { embedded });
    const authPort = await listen(0);
    const appPorts = [await listen(0), await listen(0)] as const;
    const apiPorts = [await listen(0), await listen(0)] as const;
    ports.push(authPort, ...appPorts, ...apiPorts);
    authUrl = authPort.url;
    appUrls = [appPorts[0].url, appPorts[1].url];
    await migrateApp(dbs.one);
    const clients = await seed(dbs.one, { appRedirectUri: new URL('/callback', appUrls[0]).href });
    client = clients.app;
    const idpDb: Database = {
      ...dbs.one,
      query<Row>(text: string, params: readonly unknown[] = []) {
        if (providerDatabaseDown) {
          return dbs.one.query<Row>(`do $$ begin raise exception 'the database system is shutting down'
            using errcode = '57P03'; end $$`);
        }
        return dbs.one.query<Row>(text, params);
      },
    };
    const idp = await createIdp({
      db: idpDb,
      issuer: authUrl,
      resource: 'http://127.0.0.1:1',
      refreshTokenReuseSeconds: 0,
    });
    const holding: RequestListener = (req, res) => {
      const current = hold;
      const token = req.method === 'POST' && (req.url === '/token' || req.url?.startsWith('/token?'));
      if (token && unreachable) {
        // As a provider that cannot be reached: the connection ends with no answer.
        req.socket.destroy();
        return;
      }
      if (!current || !token) {
        idp.app(req, res);
        return;
      }
      // The first waits; any other goes through at once, and says it came.
      if (!current.taken) {
        current.taken = true;
        current.first();
        void current.released.then(() => idp.app(req, res));
        return;
      }
      current.second();
      idp.app(req, res);
    };
    authPort.use(holding);
    // Each process calls an API of its own, which answers 200 and records the token it was sent.
    for (const [i, port] of apiPorts.entries()) {
      port.use((req, res) => {
        sentTokens[i]?.push((req.headers.authorization ?? '').replace(/^Bearer /, ''));
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      });
    }
    const second: Database = {
      ...dbs.two,
      query<Row>(text: string, params: readonly unknown[] = []) {
        if (watched && params[0] === watched.hash && text.includes('app_sessions')) watched.count++;
        return dbs.two.query<Row>(text, params);
      },
    };
    for (const [i, db] of [dbs.one, second].entries()) {
      const { app } = await createThirdPartyApp({
        db,
        issuer: authUrl,
        clientId: clients.app.clientId,
        clientSecret: clients.app.clientSecret,
        // Both answer as the first: the provider knows one redirect URI, as behind a load balancer.
        appUrl: appUrls[0],
        baseUrl: apiPorts[i]!.url,
        resource: 'http://127.0.0.1:1',
        now: () => Date.now() + clock,
        stockItems: ['item-1'],
      });
      appPorts[i]?.use(app);
    }
  }, 120_000);

  afterAll(async () => {
    await Promise.allSettled(ports.map((port) => port.close()));
    await dbs?.close();
  });

  const sessions = () => createSessionStore(dbs.one, { ttlSeconds: 3600 });

  /** Signs alice in at the first process; returns the session id, the cookie header and its tokens. */
  async function signIn(): Promise<{ id: string; cookie: string; tokens: SessionTokens }> {
    clock = 0;
    const agent = createUserAgent();
    const callback = await loginAndConsent(
      agent,
      authUrl,
      new URL('/signin', appUrls[0]).href,
      new URL('/callback', appUrls[0]).href,
      alice,
    );
    await agent.request(callback.href);
    const id = agent.jar.cookies.get('app_session')?.value ?? '';
    const tokens = (await sessions().get(id))?.tokens;
    expect(tokens?.refreshToken).toEqual(expect.any(String));
    return { id, cookie: agent.jar.header(), tokens: tokens! };
  }

  /** GET / at process `i` with the browser's cookie. */
  const page = (i: 0 | 1, cookie: string) =>
    fetch(new URL('/', appUrls[i]).href, { headers: { cookie }, redirect: 'manual' }).then(async (response) => ({
      status: response.status,
      body: await response.text(),
    }));

  /** How many refresh tokens the grant of `refreshToken` has had: one more per refresh. */
  async function refreshTokensOfGrant(refreshToken: string): Promise<number> {
    const { rows } = await dbs.one.query<{ count: number }>(
      `select count(*)::int as count from idp_models where model = 'RefreshToken' and grant_id =
         (select grant_id from idp_models where model = 'RefreshToken' and id = $1)`,
      [storedId('RefreshToken', refreshToken)],
    );
    return rows[0]?.count ?? 0;
  }

  it(`refreshes once for ${callers} concurrent pages on two processes, and the grant lives on`, async () => {
    const { id, cookie, tokens } = await signIn();
    sentTokens[0].length = 0;
    sentTokens[1].length = 0;
    let first = () => {};
    let second = () => {};
    let release = () => {};
    const firstCame = new Promise<void>((resolve) => {
      first = resolve;
    });
    const secondCame = new Promise<void>((resolve) => {
      second = resolve;
    });
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    hold = { first, second, released, taken: false };
    // Past the access token's five minutes, by the app's clock.
    clock = 301_000;
    try {
      const atFirst = Array.from({ length: callers / 2 }, () => page(0, cookie));
      await Promise.race([firstCame, after(10_000, 'the first process never refreshed')]);
      // The first process's refresh is at the provider, unanswered: now the second process's pages.
      watched = { hash: hashOf(id), count: 0 };
      const atSecond = Array.from({ length: callers / 2 }, () => page(1, cookie));
      // Its own refresh sent (wrong), or the row read again and again while it waits (right): a page
      // reads the session once, a refresh once more before it goes to the provider.
      const waiting = (async () => {
        while ((watched?.count ?? 0) < callers / 2 + 4) await after(5);
      })();
      await Promise.race([secondCame, waiting, after(10_000, 'the second process neither refreshed nor waited')]);
      release();
      const pages = await Promise.all([...atFirst, ...atSecond]);
      for (const answer of pages) {
        expect(answer.status).toBe(200);
        expect(answer.body).toContain('Alice');
      }
    } finally {
      hold = undefined;
      watched = undefined;
      release();
    }
    // One refresh: the grant has the first refresh token and the one it was rotated to, no more.
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(2);
    const now = (await sessions().get(id))?.tokens;
    expect(now?.refreshToken).not.toBe(tokens.refreshToken);
    expect(now?.accessToken).not.toBe(tokens.accessToken);
    // Not revoked: the stored refresh token is live at the provider.
    expect(await introspect(authUrl, now!.refreshToken!, client)).toMatchObject({ active: true });
    // Both processes called the API with the one new access token, and only with it.
    expect(new Set(sentTokens[0])).toEqual(new Set([now!.accessToken]));
    expect(new Set(sentTokens[1])).toEqual(new Set([now!.accessToken]));
    // And the session refreshes again later, from either process.
    clock = 602_000;
    expect((await page(1, cookie)).body).toContain('Alice');
    const later = (await sessions().get(id))?.tokens;
    expect(later?.refreshToken).not.toBe(now?.refreshToken);
    expect(await introspect(authUrl, later!.refreshToken!, client)).toMatchObject({ active: true });
  });

  it('gives up its claim when the provider cannot be reached, so the other process refreshes at once', async () => {
    const { id, cookie, tokens } = await signIn();
    clock = 301_000;
    unreachable = true;
    try {
      // The session is kept with its old token (the API will say if it expired), the claim let go.
      expect((await page(0, cookie)).body).toContain('Alice');
    } finally {
      unreachable = false;
    }
    expect((await sessions().get(id))?.tokens).toEqual(tokens);
    const { rows } = await dbs.one.query<{ by: string | null }>(
      'select refreshing_by as by from app_sessions where id_hash = $1',
      [hashOf(id)],
    );
    expect(rows).toEqual([{ by: null }]);
    const answer = await Promise.race([page(1, cookie), after(refreshLeaseSeconds * 500, 'the page waited')]);
    expect(answer.body).toContain('Alice');
    expect((await sessions().get(id))?.tokens?.refreshToken).not.toBe(tokens.refreshToken);
  });

  it('keeps the session when the provider answers the refresh with server_error, and refreshes it later', async () => {
    // A provider whose own database fails answers 500 with an OAuth error body (`server_error`): a
    // fault of the provider, which says nothing of the grant. The session must not end with it.
    const { id, cookie, tokens } = await signIn();
    clock = 301_000;
    providerDatabaseDown = true;
    let answer: { status: number; body: string };
    try {
      answer = await page(0, cookie);
    } finally {
      providerDatabaseDown = false;
    }
    expect(answer.status).toBe(200);
    expect(answer.body).toContain('Alice');
    expect((await sessions().get(id))?.tokens).toEqual(tokens);
    const { rows } = await dbs.one.query<{ by: string | null }>(
      'select refreshing_by as by from app_sessions where id_hash = $1',
      [hashOf(id)],
    );
    expect(rows).toEqual([{ by: null }]);
    // The provider is back: the next page refreshes with the refresh token the session still holds.
    expect((await page(1, cookie)).body).toContain('Alice');
    const now = (await sessions().get(id))?.tokens;
    expect(now?.refreshToken).not.toBe(tokens.refreshToken);
    expect(await introspect(authUrl, now!.refreshToken!, client)).toMatchObject({ active: true });
  });

  it('refreshes a session whose refresh was left unfinished by a process that died', async () => {
    const { id, cookie, tokens } = await signIn();
    // A process claimed the refresh and was gone before it finished: its claim ends with its time,
    // which has passed (the database's clock cannot be moved: the claim is aged instead).
    expect(await sessions().claimRefresh(id, 'a process that died')).toBeDefined();
    const { rowCount } = await dbs.one.query(
      `update app_sessions set refreshing_until = now() - interval '1 second' where id_hash = $1`,
      [hashOf(id)],
    );
    expect(rowCount).toBe(1);
    clock = 301_000;
    const answer = await Promise.race([page(1, cookie), after(refreshLeaseSeconds * 500, 'the page waited')]);
    expect(answer.body).toContain('Alice');
    const now = (await sessions().get(id))?.tokens;
    expect(now?.refreshToken).not.toBe(tokens.refreshToken);
    expect(await introspect(authUrl, now!.refreshToken!, client)).toMatchObject({ active: true });
  });
});
