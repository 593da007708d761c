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
import type { RequestListener } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { refreshLeaseSeconds } from '../src/app/sessions.js';
import type { Database } from '../src/db.js';
import { introspect } from './flow.js';
import { hashOf, startTwoAppStack, type TwoAppStack } from './two-app-stack.js';

/** Pages of one session sent at once, half to each process. */
const callers = 10;

/** Resolves after `ms`, or rejects after it when `reason` is given (a bound on a wait that must end). */
const after = (ms: number, reason?: string) =>
  new Promise<never>((resolve, reject) =>
    setTimeout(() => (reason === undefined ? resolve(undefined as never) : reject(new Error(reason))), ms),
  );

const stores: Array<[string, boolean]> = [['the embedded PGlite', true]];
if (process.env.DATABASE_URL) stores.push(['PostgreSQL, through two pools', false]);

describe.each(stores)('a session refreshed by two app processes at once, on %s', (_name, embedded) => {
  let stack: TwoAppStack;
  /** The app's clock, ahead of the real one by this much (both processes share it). */
  let clock = 0;

  /** The provider's token requests while `hold` is set: the first waits for `hold.released`. */
  let hold: { first: () => void; second: () => void; released: Promise<void>; taken: boolean } | undefined;
  /** The token endpoint drops every connection while this is set. */
  let unreachable = false;
  /** The provider's database refuses every statement while this is set (it answers 500 server_error). */
  let providerDatabaseDown = false;
  /** Statements the second process ran on the watched session row. */
  let watched: { hash: string; count: number } | undefined;

  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'refresh_lock',
      embedded,
      idp: { refreshTokenReuseSeconds: 0 },
      now: () => Date.now() + clock,
      wrapIdpDb: (db): Database => ({
        ...db,
        query<Row>(text: string, params: readonly unknown[] = []) {
          if (providerDatabaseDown) {
            return db.query<Row>(`do $$ begin raise exception 'the database system is shutting down'
              using errcode = '57P03'; end $$`);
          }
          return db.query<Row>(text, params);
        },
      }),
      authMiddleware:
        (provider): RequestListener =>
        (req, res) => {
          const current = hold;
          const token = req.method === 'POST' && (req.url === '/token' || req.url?.startsWith('/token?'));
          if (token && unreachable) {
            // As a provider that cannot be reached: the connection ends with no answer.
            req.socket.destroy();
            return;
          }
          if (!current || !token) {
            provider(req, res);
            return;
          }
          // The first waits; any other goes through at once, and says it came.
          if (!current.taken) {
            current.taken = true;
            current.first();
            void current.released.then(() => provider(req, res));
            return;
          }
          current.second();
          provider(req, res);
        },
      wrapDb: (db, i): Database =>
        i === 0
          ? db
          : {
              ...db,
              query<Row>(text: string, params: readonly unknown[] = []) {
                if (watched && params[0] === watched.hash && text.includes('app_sessions')) watched.count++;
                return db.query<Row>(text, params);
              },
            },
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
  });

  /** Signs alice in at the first process, by the real clock. */
  const signIn = () => {
    clock = 0;
    return stack.signIn();
  };
  const sessions = () => stack.sessions();
  const page = (i: 0 | 1, cookie: string) => stack.page(i, cookie);

  it(`refreshes once for ${callers} concurrent pages on two processes, and the grant lives on`, async () => {
    const { id, cookie, tokens } = await signIn();
    stack.sentTokens[0].length = 0;
    stack.sentTokens[1].length = 0;
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
    expect(await stack.refreshTokensOfGrant(tokens.refreshToken!)).toBe(2);
    const now = (await sessions().get(id))?.tokens;
    expect(now?.refreshToken).not.toBe(tokens.refreshToken);
    expect(now?.accessToken).not.toBe(tokens.accessToken);
    // Not revoked: the stored refresh token is live at the provider.
    expect(await introspect(stack.authUrl, now!.refreshToken!, stack.client)).toMatchObject({ active: true });
    // Both processes called the API with the one new access token, and only with it.
    expect(new Set(stack.sentTokens[0])).toEqual(new Set([now!.accessToken]));
    expect(new Set(stack.sentTokens[1])).toEqual(new Set([now!.accessToken]));
    // And the session refreshes again later, from either process.
    clock = 602_000;
    expect((await page(1, cookie)).body).toContain('Alice');
    const later = (await sessions().get(id))?.tokens;
    expect(later?.refreshToken).not.toBe(now?.refreshToken);
    expect(await introspect(stack.authUrl, later!.refreshToken!, stack.client)).toMatchObject({ active: true });
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
    const { rows } = await stack.dbs.one.query<{ by: string | null }>(
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
    const { rows } = await stack.dbs.one.query<{ by: string | null }>(
      'select refreshing_by as by from app_sessions where id_hash = $1',
      [hashOf(id)],
    );
    expect(rows).toEqual([{ by: null }]);
    // The provider is back: the next page refreshes with the refresh token the session still holds.
    expect((await page(1, cookie)).body).toContain('Alice');
    const now = (await sessions().get(id))?.tokens;
    expect(now?.refreshToken).not.toBe(tokens.refreshToken);
    expect(await introspect(stack.authUrl, now!.refreshToken!, stack.client)).toMatchObject({ active: true });
  });

  it('refreshes a session whose refresh was left unfinished by a process that died', async () => {
    const { id, cookie, tokens } = await signIn();
    // A process claimed the refresh and was gone before it finished: its claim ends with its time,
    // which has passed (the database's clock cannot be moved: the claim is aged instead).
    expect(await sessions().claimRefresh(id, 'a process that died')).toBeDefined();
    const { rowCount } = await stack.dbs.one.query(
      `update app_sessions set refreshing_until = now() - interval '1 second' where id_hash = $1`,
      [hashOf(id)],
    );
    expect(rowCount).toBe(1);
    clock = 301_000;
    const answer = await Promise.race([page(1, cookie), after(refreshLeaseSeconds * 500, 'the page waited')]);
    expect(answer.body).toContain('Alice');
    const now = (await sessions().get(id))?.tokens;
    expect(now?.refreshToken).not.toBe(tokens.refreshToken);
    expect(await introspect(stack.authUrl, now!.refreshToken!, stack.client)).toMatchObject({ active: true });
  });
});
