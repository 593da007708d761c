// A refresh whose new tokens the database will not take. The provider rotates the refresh token when
// it answers: from then on the session's stored refresh token is spent, and presenting it again is
// reuse, which revokes the whole grant (the user signed out everywhere). So the statement that
// stores the new tokens (`finishRefresh`) failing once (a blip, a pool timeout) must not lose them,
// and failing for good must not let the spent token be presented again while the claim lasts.
//
// The fault is the database's own: the store statement is replaced by one the database refuses with
// the error of a connection terminated by the server (57P01), on PostgreSQL and on PGlite. The app
// runs twice on one database, as in refresh-across-processes.int.test.ts, with the provider's reuse
// interval off (`refreshTokenReuseSeconds: 0`): a second use of a spent token revokes at once.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { storedId } from '../src/idp/stored-id.js';
import { databases, terminated } from './db-faults.js';
import { introspect } from './flow.js';
import { hashOf, startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { formField } from './user-agent.js';

/** Rejects after `ms` (a bound on a wait that must end). */
const after = (ms: number, reason: string) =>
  new Promise<never>((_resolve, reject) => setTimeout(() => reject(new Error(reason)), ms));

/** The statement that stores a refresh's tokens and ends its claim (sessions.ts, `finishRefresh`). */
const storesRefresh = (text: string, params: readonly unknown[]) =>
  text.trimStart().startsWith('update app_sessions set data') &&
  text.includes('refreshing_by = $5') &&
  String(params[1]).includes('"sealed"');

describe.each(databases)('a refresh whose tokens the database fails to store, on %s', (_name, embedded) => {
  let stack: TwoAppStack;
  /** The app's clock, ahead of the real one by this much (both processes share it). */
  let clock = 0;
  /** Access tokens the processes sent to the API (one API for both). */
  let sentTokens: string[] = [];
  /** How many more of the first process's store statements fail (Infinity: all of them). */
  let failures = 0;
  /** How many of them were sent. */
  let storeAttempts = 0;
  /** While set, the provider's token requests wait for `released`; `came` is called as each arrives. */
  let hold: { came: () => void; released: Promise<void> } | undefined;
  /** While set, called with each session read (`get`) of the first process, once it is answered. */
  let onRead: ((answered: Promise<unknown>) => void) | undefined;

  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'refresh_store',
      embedded,
      idp: { refreshTokenReuseSeconds: 0 },
      now: () => Date.now() + clock,
      sharedApi: true,
      authMiddleware: (provider) => (req, res) => {
        const current = hold;
        if (!current || req.method !== 'POST' || !req.url?.startsWith('/token')) {
          provider(req, res);
          return;
        }
        current.came();
        void current.released.then(() => provider(req, res));
      },
      wrapDb: (db, i): Database =>
        i === 1
          ? db
          : {
              ...db,
              query<Row>(text: string, params: readonly unknown[] = []) {
                if (storesRefresh(text, params)) {
                  storeAttempts++;
                  if (failures > 0) {
                    failures--;
                    return db.query<Row>(terminated);
                  }
                }
                const answer = db.query<Row>(text, params);
                if (onRead && text.includes('with seen as')) onRead(answer);
                return answer;
              },
            },
    });
    sentTokens = stack.sentTokens[0];
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
  });

  /** Signs alice in at the first process, by the real clock and with a database that takes every statement. */
  async function signIn() {
    clock = 0;
    failures = 0;
    const signedIn = await stack.signIn();
    sentTokens.length = 0;
    storeAttempts = 0;
    return signedIn;
  }
  const sessions = () => stack.sessions();
  const page = (i: 0 | 1, cookie: string) => stack.page(i, cookie);
  const claimOf = (id: string) => stack.claimOf(id);
  const refreshTokensOfGrant = (refreshToken: string) => stack.refreshTokensOfGrant(refreshToken);
  /** The provider's grant id of a refresh token. */
  const grantOf = async (refreshToken: string) =>
    (
      await stack.dbs.one.query<{ grant: string }>(
        `select grant_id as grant from idp_models where model = 'RefreshToken' and id = $1`,
        [storedId('RefreshToken', refreshToken)],
      )
    ).rows[0]!.grant;
  /** How many refresh tokens the provider holds under `grant`. */
  const refreshTokensUnder = async (grant: string) =>
    (
      await stack.dbs.one.query<{ count: number }>(
        `select count(*)::int as count from idp_models where model = 'RefreshToken' and grant_id = $1`,
        [grant],
      )
    ).rows[0]!.count;

  it('stores the new tokens when the store fails once, and the grant lives on', async () => {
    const { id, cookie, tokens } = await signIn();
    clock = 301_000;
    failures = 1;
    const answer = await page(0, cookie);
    expect(answer.status).toBe(200);
    expect(answer.body).toContain('Alice');
    expect(storeAttempts).toBe(2);
    const now = (await sessions().get(id))?.tokens;
    expect(now?.refreshToken).not.toBe(tokens.refreshToken);
    expect(await claimOf(id)).toEqual({ by: null, running: false });
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(2);
    expect(await introspect(stack.authUrl, now!.refreshToken!, stack.client)).toMatchObject({ active: true });
    expect(new Set(sentTokens)).toEqual(new Set([now!.accessToken]));
  });

  it('never presents the spent refresh token again while its claim lasts when the store keeps failing', async () => {
    const { id, cookie, tokens } = await signIn();
    clock = 301_000;
    failures = Number.POSITIVE_INFINITY;
    // The page is served with the new access token, the one the provider just issued.
    const first = await page(0, cookie);
    expect(first.status).toBe(200);
    expect(first.body).toContain('Alice');
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(2);
    expect(sentTokens.length).toBeGreaterThan(0);
    const issued = sentTokens[0]!;
    expect(issued).not.toBe(tokens.accessToken);
    expect(new Set(sentTokens)).toEqual(new Set([issued]));
    // Tried more than once, and then the claim kept: its time is running.
    expect(storeAttempts).toBeGreaterThan(1);
    expect((await sessions().get(id))?.tokens).toEqual(tokens);
    const claim = await claimOf(id);
    expect(claim.by).toEqual(expect.any(String));
    expect(claim.running).toBe(true);

    // This process's next pages use the tokens it holds: no second refresh, no spent token.
    sentTokens.length = 0;
    expect((await page(0, cookie)).body).toContain('Alice');
    expect(new Set(sentTokens)).toEqual(new Set([issued]));
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(2);
    // Another process cannot claim the refresh while the claim lasts, so it presents nothing either.
    expect(await sessions().claimRefresh(id, 'another process')).toBeUndefined();

    // The database takes statements again: the next page stores the tokens held, and ends the claim.
    failures = 0;
    expect((await page(0, cookie)).body).toContain('Alice');
    const stored = (await sessions().get(id))?.tokens;
    expect(stored?.accessToken).toBe(issued);
    expect(stored?.refreshToken).not.toBe(tokens.refreshToken);
    expect(await claimOf(id)).toEqual({ by: null, running: false });
    // The grant was never revoked: one rotation (a second use of the spent token would have revoked
    // it at once), and the stored refresh token is live.
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(2);
    expect(await introspect(stack.authUrl, stored!.refreshToken!, stack.client)).toMatchObject({ active: true });
    // And the other process refreshes it later as usual.
    clock = 602_000;
    expect((await page(1, cookie)).body).toContain('Alice');
    const later = (await sessions().get(id))?.tokens;
    expect(later?.refreshToken).not.toBe(stored?.refreshToken);
    expect(await introspect(stack.authUrl, later!.refreshToken!, stack.client)).toMatchObject({ active: true });
  });

  // Decided: once the kept claim's time (30 s) has passed while the first process still holds the new
  // tokens unstored (its store keeps failing), another process takes the claim over and presents the
  // row's refresh token, the spent one: the provider takes it for reuse and revokes the grant. The
  // first process cannot renew the claim through a database that fails it, and the second cannot
  // tell a claim that lapsed after the provider answered from one of a process that died before
  // asking; refusing to present after a lapsed claim would strand the session. So this double fault
  // (the store failing past the claim's time, the session served by another process) ends the session
  // as a refused refresh does, closed: the user signs in again, every process sees it ended, and no
  // token of the grant stays usable, the held ones included.
  it('ends the session, closed, when a kept claim lapses with the tokens still held and another process refreshes', async () => {
    const { id, cookie, tokens } = await signIn();
    clock = 301_000;
    failures = Number.POSITIVE_INFINITY;
    try {
      expect((await page(0, cookie)).body).toContain('Alice');
      expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(2);
      const grant = await grantOf(tokens.refreshToken!);
      expect(await refreshTokensUnder(grant)).toBe(2);
      expect((await claimOf(id)).running).toBe(true);
      // The claim's time passes (the row is aged: the database's clock cannot be moved).
      await stack.dbs.one.query(
        `update app_sessions set refreshing_until = now() - interval '1 second' where id_hash = $1`,
        [hashOf(id)],
      );
      // The other process finds the token due, takes the lapsed claim over, and presents the row's refresh token.
      const other = await page(1, cookie);
      expect(other.status).toBeLessThan(500);
      expect(other.body).not.toContain('Alice');
      expect(await sessions().get(id)).toBeUndefined();
      const first = await page(0, cookie);
      expect(first.status).toBeLessThan(500);
      expect(first.body).not.toContain('Alice');
      // The grant is revoked: the refresh token held unstored went with it.
      expect(await refreshTokensUnder(grant)).toBe(0);
    } finally {
      failures = 0;
    }
  });

  it('refreshes the tokens it holds unstored with their own refresh token, the live one, when they expire', async () => {
    const { id, cookie, tokens } = await signIn();
    clock = 301_000;
    failures = Number.POSITIVE_INFINITY;
    expect((await page(0, cookie)).body).toContain('Alice');
    const issued = sentTokens[0]!;
    // The held access token expires too, with the database still failing: the next refresh presents
    // the held refresh token (the spent one would revoke the grant) under the claim still held.
    clock = 602_000;
    sentTokens.length = 0;
    expect((await page(0, cookie)).body).toContain('Alice');
    const again = sentTokens[0]!;
    expect(again).not.toBe(issued);
    expect(new Set(sentTokens)).toEqual(new Set([again]));
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(3);
    expect((await claimOf(id)).running).toBe(true);
    failures = 0;
    expect((await page(0, cookie)).body).toContain('Alice');
    const stored = (await sessions().get(id))?.tokens;
    expect(stored?.accessToken).toBe(again);
    expect(await claimOf(id)).toEqual({ by: null, running: false });
    expect(await introspect(stack.authUrl, stored!.refreshToken!, stack.client)).toMatchObject({ active: true });
  });

  it('keeps the tokens of a refresh of held tokens when another request stores the held ones meanwhile', async () => {
    // The held tokens' refresh token is being presented (their access token expired, the database
    // still failing) when the database comes back and another page of the same process offers the
    // held tokens to it. Stored then, they end the claim, and the refresh's own tokens, issued for
    // the held refresh token, find no claim to be stored under: the row keeps the refresh token just
    // spent, and the next refresh presents it (reuse: the grant is revoked).
    const { id, cookie, tokens } = await signIn();
    clock = 301_000;
    failures = Number.POSITIVE_INFINITY;
    expect((await page(0, cookie)).body).toContain('Alice');
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(2);
    clock = 602_000;
    let came = () => {};
    let release = () => {};
    const atProvider = new Promise<void>((resolve) => {
      came = resolve;
    });
    hold = {
      came,
      released: new Promise<void>((resolve) => {
        release = resolve;
      }),
    };
    try {
      const refreshing = page(0, cookie);
      await Promise.race([atProvider, after(10_000, 'the held tokens were never refreshed')]);
      failures = 0;
      storeAttempts = 0;
      // The other page's read of the session, answered, and what that page does next with it (the
      // offer of the held tokens follows at once: no timer between them).
      const read = new Promise<Promise<unknown>>((resolve) => {
        onRead = resolve;
      });
      const other = page(0, cookie);
      await await Promise.race([read, after(10_000, 'the other page never read the session')]);
      onRead = undefined;
      await new Promise((resolve) => setImmediate(resolve));
      await new Promise((resolve) => setImmediate(resolve));
      release();
      for (const answer of await Promise.all([refreshing, other])) expect(answer.body).toContain('Alice');
    } finally {
      hold = undefined;
      onRead = undefined;
      release();
    }
    // Two refreshes in all, and the row holds the second one's tokens: its refresh token is live.
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(3);
    const stored = (await sessions().get(id))?.tokens;
    expect(await claimOf(id)).toEqual({ by: null, running: false });
    expect(await introspect(stack.authUrl, stored!.refreshToken!, stack.client)).toMatchObject({ active: true });
    // And the session refreshes again later: no spent token presented, the grant lives on.
    clock = 903_000;
    expect((await page(0, cookie)).body).toContain('Alice');
    const later = (await sessions().get(id))?.tokens;
    expect(later?.refreshToken).not.toBe(stored?.refreshToken);
    expect(await introspect(stack.authUrl, later!.refreshToken!, stack.client)).toMatchObject({ active: true });
  });

  it('drops the tokens it holds unstored when the session is signed out at another process, whose revocation kills them', async () => {
    const { id, cookie, tokens, agent } = await signIn();
    const form = await agent.request(new URL('/', stack.appUrls[0]).href);
    clock = 301_000;
    failures = Number.POSITIVE_INFINITY;
    expect((await page(0, cookie)).body).toContain('Alice');
    // The held tokens: one refresh, not stored.
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(2);
    expect((await sessions().get(id))?.tokens).toEqual(tokens);
    // Signed out at the other process: it revokes the row's refresh token, the spent one.
    const out = await agent.postForm(new URL('/signout', stack.appUrls[1]).href, {
      csrf: formField(form.body, 'csrf'),
    });
    expect(out.response.status).toBe(303);
    expect(await sessions().get(id)).toBeUndefined();
    // That revoked the grant, so the refresh token held unstored is dead too: no token of it is left.
    expect(await refreshTokensOfGrant(tokens.refreshToken!)).toBe(0);
    // The first process, its database back or not, uses nothing it held for that session.
    for (const down of [Number.POSITIVE_INFINITY, 0]) {
      failures = down;
      sentTokens.length = 0;
      const answer = await page(0, cookie);
      expect(answer.body).not.toContain('Alice');
      expect(sentTokens).toEqual([]);
    }
  });
});
