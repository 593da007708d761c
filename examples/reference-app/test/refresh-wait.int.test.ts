// The refresher's waits run on its injected clock and pause (refresh.ts, `clock` and `sleep`), as
// everything else of it does: a request that finds another process's claim on its session's refresh
// waits, reading the session again, and gives up once the claim's time and 5 seconds have passed; a
// refresh whose tokens the database would not store tries again after 50 ms and 250 ms. A test drives
// both without waiting for them.
//
// The refresher on the real database (PostgreSQL with DATABASE_URL, PGlite otherwise); the provider
// is a stand-in (no refresh is asked of it in the first test). The last test runs the whole app
// (startReferenceApp), whose `refreshTiming` reaches the refresher.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRefresher, type RefreshTurn } from '../src/app/refresh.js';
import { migrateApp } from '../src/app/schema.js';
import { createSessionStore, refreshLeaseSeconds } from '../src/app/sessions.js';
import type { Database } from '../src/db.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { failingRefreshStores } from './db-faults.js';
import { loginAndConsent } from './flow.js';
import { openTestDatabase } from './services.js';
import { alice } from './test-idp.js';
import { createUserAgent } from './user-agent.js';

describe("the refresher's waits", () => {
  let db: Database;
  /** While true, every store of a refresh's tokens fails. */
  let failing = false;
  const failingDb = () => failingRefreshStores(db, () => failing);

  beforeAll(async () => {
    db = await openTestDatabase('refresh_wait');
    await migrateApp(db);
  }, 60_000);

  afterAll(async () => {
    await db?.close();
  });

  /** A refresher whose clock moves only by the pauses it asks for, which it gets at once. */
  const refresherOnClock = (
    refresh: () =>
      | Promise<never>
      | Promise<{ tokens: { accessToken: string; refreshToken: string; expiresAt: number } }>,
  ) => {
    const sessions = createSessionStore(failingDb(), { ttlSeconds: 3600 });
    let at = 1_000_000;
    const pauses: number[] = [];
    const refresher = createRefresher({
      sessions,
      oidc: { refresh },
      now: Date.now,
      clock: () => at,
      sleep: async (ms) => {
        pauses.push(ms);
        at += ms;
      },
      refreshMargin: 30_000,
      unstoredForMs: 1_800_000,
      onRefused: () => undefined,
      revoke: async () => undefined,
    });
    return { sessions, refresher, pauses, elapsed: () => at - 1_000_000 };
  };

  const user = { sub: 'user-alice' };
  const due = () => ({ accessToken: 'at-0', refreshToken: 'rt-0', expiresAt: Date.now() - 1000 });

  // Was wrong: the give-up time was read from Date.now and each pause was a real setTimeout, beside the
  // injected `clock`: no test could reach the give-up without waiting 35 real seconds.
  it("gives up waiting for another process's claim once its time and 5 s have passed, by the injected clock", async () => {
    let asked = 0;
    const { sessions, refresher, pauses, elapsed } = refresherOnClock(async () => {
      asked++;
      throw new Error('no refresh is asked while another process holds the claim');
    });
    const id = await sessions.create({ user, tokens: due() });
    // Another process's refresh, under way (its claim lasts refreshLeaseSeconds by the database's clock).
    expect(await sessions.claimRefresh(id, 'another-process')).toBeDefined();
    const turn: RefreshTurn = { failed: false };
    const fresh = await refresher.fresh(id, (await sessions.get(id))!, turn);
    // The session as it is, its tokens unchanged, and the request's refresh counted as failed.
    expect(fresh?.tokens?.accessToken).toBe('at-0');
    expect(turn.failed).toBe(true);
    expect(asked).toBe(0);
    const limit = (refreshLeaseSeconds + 5) * 1000;
    expect(elapsed()).toBeGreaterThanOrEqual(limit);
    expect(elapsed() - pauses.at(-1)!).toBeLessThan(limit);
    // Doubling from 20 ms, at most 250 ms each.
    expect(pauses.slice(0, 5)).toEqual([20, 40, 80, 160, 250]);
    expect(Math.max(...pauses)).toBe(250);
  }, 10_000);

  it("pauses 50 ms and 250 ms between its tries to store a refresh's tokens, by the injected pause", async () => {
    const { sessions, refresher, pauses } = refresherOnClock(async () => ({
      tokens: { accessToken: 'at-1', refreshToken: 'rt-1', expiresAt: Date.now() + 300_000 },
    }));
    const id = await sessions.create({ user, tokens: due() });
    failing = true;
    try {
      const fresh = await refresher.fresh(id, (await sessions.get(id))!);
      // Every try failed: the tokens are held here, and this request goes on with them.
      expect(fresh?.tokens?.accessToken).toBe('at-1');
    } finally {
      failing = false;
    }
    expect(pauses).toEqual([50, 250]);
    expect(refresher.held()).toBe(1);
  }, 10_000);
});

describe("the app's refresh waits, on the timing given to startReferenceApp", () => {
  let db: Database;
  let running: RunningReferenceApp;
  /** The app's token clock (`now`), ahead of the real one by this much. */
  let clock = 0;
  /** The refresher's own clock, moved only by the pauses it asks for, which it gets at once. */
  let at = 1_000_000;

  beforeAll(async () => {
    db = await openTestDatabase('refresh_wait_app');
    running = await startReferenceApp({
      db,
      authPort: 0,
      appPort: 0,
      // Nothing listens there: the page's reads say "API unavailable", the page itself is shown.
      baseUrl: 'http://127.0.0.1:9',
      now: () => Date.now() + clock,
      refreshTiming: {
        clock: () => at,
        sleep: async (ms) => {
          at += ms;
        },
      },
    });
  }, 60_000);

  afterAll(async () => {
    await running?.close();
    await db?.close();
  });

  // Was wrong: createThirdPartyApp (and startReferenceApp) took no clock or pause for the refresher,
  // which then always waited on Date.now and real timers: a page whose session another process was
  // refreshing could be driven to the give-up only by waiting 35 real seconds.
  it("gives up a page's wait for another process's claim by the injected clock, and shows the page", async () => {
    const agent = createUserAgent();
    const appUrl = (path: string) => new URL(path, running.appUrl).href;
    await agent.request(
      (await loginAndConsent(agent, running.authUrl, appUrl('/signin'), appUrl('/callback'), alice)).href,
    );
    const id = agent.jar.cookies.get('app_session')?.value ?? '';
    const sessions = createSessionStore(db, { ttlSeconds: 3600 });
    const before = (await sessions.get(id))?.tokens;
    expect(before?.refreshToken).toEqual(expect.any(String));
    // Another process's refresh, under way; the access token is due.
    expect(await sessions.claimRefresh(id, 'another-process')).toBeDefined();
    clock = 301_000;
    const started = at;
    const page = await agent.request(appUrl('/'));
    expect(page.response.status).toBe(200);
    expect(page.body).toContain('Alice Liddell');
    expect(at - started).toBeGreaterThanOrEqual((refreshLeaseSeconds + 5) * 1000);
    // Nothing was refreshed here: the other process's refresh is the session's.
    expect((await sessions.get(id))?.tokens).toEqual(before);
  }, 10_000);
});
