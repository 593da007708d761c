// The refresh token reuse interval (Auth0's "reuse interval", Okta's "grace period for token rotation"):
// a rotated refresh token presented again within `refreshTokenReuseSeconds` of its first use is
// answered once more, with fresh tokens, instead of revoking the grant. The client whose answer was
// lost (a 500 after the rotation, a proxy timeout, a provider killed mid-refresh) holds only the used
// token, and its retry is no theft. Past the interval, or a second time, reuse revokes the whole grant
// as before (RFC 9700 section 4.14.2).
//
// Time is the database's: the adapter compares the first use (`consumed_at`) with the database's
// `now()`, as it does for every expiry. Moving `consumed_at` into the past is what waiting would do.
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { createIdp } from '../src/idp/server.js';
import { storedId } from '../src/idp/stored-id.js';
import { listen } from '../src/listen.js';
import type { RunningReferenceApp } from '../src/start.js';
import { type Credentials, codeFlow, introspect, tokenRequest } from './flow.js';
import { alice, resource, startTestIdp, type TestIdp } from './test-idp.js';
import { decodeJwt } from './user-agent.js';

let started: TestIdp;
let db: Database;
let running: RunningReferenceApp;
let app: Required<Credentials>;

beforeAll(async () => {
  started = await startTestIdp('refresh_reuse');
  ({ db, running, app } = started);
});

afterAll(() => started?.close());

const refresh = (token: string, base = running.authUrl) =>
  tokenRequest(base, { grant_type: 'refresh_token', refresh_token: token }, app);

/** Moves the first use of `token` `seconds` into the past, as waiting that long would. */
async function usedAgo(token: string, seconds: number) {
  const { rowCount } = await db.query(
    `update idp_models set consumed_at = consumed_at - make_interval(secs => $2)
     where model = 'RefreshToken' and id = $1 and consumed_at is not null`,
    [storedId('RefreshToken', token), seconds],
  );
  expect(rowCount).toBe(1);
}

/** Resolves once `ready` answers true, asked every 10 ms for up to 5 s. */
async function waitFor(ready: () => Promise<boolean>) {
  for (let waited = 0; waited < 5_000; waited += 10) {
    if (await ready()) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error('waited 5 s in vain');
}

/** A signed-in alice and her first refresh: the used token and the one it was rotated to. */
async function rotatedOnce() {
  const { tokens } = await codeFlow(running.authUrl, app, alice);
  const used = tokens.body.refresh_token as string;
  const first = await refresh(used);
  expect(first.status).toBe(200);
  return { used, successor: first.body.refresh_token as string };
}

describe('a used refresh token within the reuse interval (30 seconds by default)', () => {
  it('is answered once more, with fresh tokens, and the refresh token it gets refreshes', async () => {
    const { used, successor } = await rotatedOnce();
    const again = await refresh(used);
    expect(again.status, JSON.stringify(again.body)).toBe(200);
    const renewed = again.body.refresh_token as string;
    expect(renewed).toEqual(expect.any(String));
    expect(renewed).not.toBe(used);
    expect(renewed).not.toBe(successor);
    expect(decodeJwt(again.body.access_token).payload.aud).toBe(resource);
    expect((await refresh(renewed)).status).toBe(200);
  });

  it('is answered until the last second of the interval', async () => {
    const { used } = await rotatedOnce();
    await usedAgo(used, 28);
    expect((await refresh(used)).status).toBe(200);
  });

  it('supersedes the successor of its first use: that one, presented later, is a replay and revokes the grant', async () => {
    // Only one line of refresh tokens lives. The client that retried holds the newest; whoever holds
    // the one before (the lost answer's, or a thief's) gives the fork away at its next refresh.
    const { used, successor } = await rotatedOnce();
    const again = await refresh(used);
    expect(again.status).toBe(200);
    const late = await refresh(successor);
    expect(late.body.error).toBe('invalid_grant');
    expect((await refresh(again.body.refresh_token)).body.error).toBe('invalid_grant');
  });

  it('is answered once more only: a third use, still within the interval, revokes the grant', async () => {
    const { used } = await rotatedOnce();
    const again = await refresh(used);
    expect(again.status).toBe(200);
    const third = await refresh(used);
    expect(third.status).toBe(400);
    expect(third.body.error).toBe('invalid_grant');
    expect((await refresh(again.body.refresh_token)).body.error).toBe('invalid_grant');
  });

  it('revokes the grant once the token it was rotated to has been used: only the latest used token gets the interval', async () => {
    const { used, successor } = await rotatedOnce();
    const next = await refresh(successor);
    expect(next.status).toBe(200);
    const stale = await refresh(used);
    expect(stale.body.error).toBe('invalid_grant');
    expect((await refresh(next.body.refresh_token)).body.error).toBe('invalid_grant');
  });

  // Was wrong: the reuse read "the token it was rotated to is unused" in its statement's snapshot. A
  // refresh with that successor (its holder's next refresh), committed while the reuse's statement
  // ran, was not seen: both were answered, and two lines of refresh tokens lived on, neither of them
  // ever read as a replay (a thief who reused the token at that moment kept a line of its own).
  // PostgreSQL only: PGlite has one connection, so the two cannot overlap.
  it.runIf(process.env.DATABASE_URL)(
    'is a replay when the token it was rotated to is used while the reuse is under way',
    async () => {
      const { used, successor } = await rotatedOnce();
      // The successor's refresh, caught in the middle: its consume (the adapter's statement) done
      // and not yet committed, so its row stays locked and reads as unused elsewhere.
      const holder = await (db.client as pg.Pool).connect();
      try {
        await holder.query('begin');
        await holder.query(
          `update idp_models set consumed_at = now(), payload = jsonb_set(payload, '{consumed}', to_jsonb(1))
           where model = 'RefreshToken' and id = $1 and consumed_at is null`,
          [storedId('RefreshToken', successor)],
        );
        const reuse = refresh(used);
        // Until the reuse's statement waits for that row.
        await waitFor(async () => {
          const { rows } = await db.query<{ waiting: number }>(
            `select count(*)::int as waiting from pg_stat_activity
             where wait_event_type = 'Lock' and datname = current_database()`,
          );
          return (rows[0]?.waiting ?? 0) > 0;
        });
        await holder.query('commit');
        const answer = await reuse;
        expect(answer.body.error, JSON.stringify(answer.body)).toBe('invalid_grant');
      } finally {
        await holder.query('rollback').catch(() => undefined);
        holder.release();
      }
    },
  );

  it('introspects as active while it would be answered, and inactive once the interval is over', async () => {
    const { used } = await rotatedOnce();
    expect(await introspect(running.authUrl, used, app)).toMatchObject({ active: true });
    await usedAgo(used, 31);
    expect(await introspect(running.authUrl, used, app)).toEqual({ active: false });
  });
});

describe('a used refresh token past the reuse interval', () => {
  it('revokes the whole grant, as every reuse did before the interval', async () => {
    const { used, successor } = await rotatedOnce();
    await usedAgo(used, 31);
    const reuse = await refresh(used);
    expect(reuse.status).toBe(400);
    expect(reuse.body.error).toBe('invalid_grant');
    expect((await refresh(successor)).body.error).toBe('invalid_grant');
  });
});

describe('refreshTokenReuseSeconds: 0', () => {
  let strict: Awaited<ReturnType<typeof listen>>;

  beforeAll(async () => {
    strict = await listen(0);
    const idp = await createIdp({ db, issuer: strict.url, resource, refreshTokenReuseSeconds: 0 });
    strict.use(idp.app);
  });

  afterAll(async () => {
    await strict?.close();
  });

  it('keeps the strict rule: a used refresh token presented again at once revokes the grant', async () => {
    const { tokens } = await codeFlow(strict.url, app, alice);
    const used = tokens.body.refresh_token as string;
    const first = await refresh(used, strict.url);
    expect(first.status).toBe(200);
    const reuse = await refresh(used, strict.url);
    expect(reuse.status).toBe(400);
    expect(reuse.body.error).toBe('invalid_grant');
    expect((await refresh(first.body.refresh_token, strict.url)).body.error).toBe('invalid_grant');
  });

  it.each([-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY])('refuses %s with a TypeError', async (seconds) => {
    await expect(createIdp({ db, issuer: strict.url, resource, refreshTokenReuseSeconds: seconds })).rejects.toThrow(
      TypeError,
    );
  });
});
