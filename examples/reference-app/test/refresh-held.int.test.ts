// Tokens a refresh brought that the database would not store are held by the process that asked for
// them (refresh.ts, `unstored`), until the database takes them or their session ends. A session whose
// browser never comes back ends by its idle time at the database, and nothing here hears of it: the
// entry goes once untouched for as long (`unstoredForMs`), found so by the next request of any session,
// not only by the next entry held. Otherwise a process holding one entry keeps it for good.
//
// The refresher on the real database (PostgreSQL with DATABASE_URL, PGlite otherwise), its store
// statement refused by the database itself (57P01); the provider's refresh answers new tokens.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRefresher } from '../src/app/refresh.js';
import { migrateApp } from '../src/app/schema.js';
import { createSessionStore } from '../src/app/sessions.js';
import type { Database } from '../src/db.js';
import { failingRefreshStores } from './db-faults.js';
import { openTestDatabase } from './services.js';

describe('tokens held unstored', () => {
  let db: Database;
  /** While true, every store of a refresh's tokens fails. */
  let failing = false;
  const failingDb = () => failingRefreshStores(db, () => failing);

  beforeAll(async () => {
    db = await openTestDatabase('refresh_held');
    await migrateApp(db);
  }, 60_000);

  afterAll(async () => {
    await db?.close();
  });

  it('go once untouched for the idle time, found so by a request of another session', async () => {
    const sessions = createSessionStore(failingDb(), { ttlSeconds: 3600 });
    let real = 1_000_000;
    let issued = 0;
    const refresher = createRefresher({
      sessions,
      oidc: {
        refresh: async () => {
          issued++;
          return {
            tokens: { accessToken: `at-${issued}`, refreshToken: `rt-${issued}`, expiresAt: Date.now() + 300_000 },
          };
        },
      },
      now: Date.now,
      clock: () => real,
      refreshMargin: 30_000,
      unstoredForMs: 1_800_000,
      onRefused: () => undefined,
      revoke: async () => undefined,
    });
    const user = { sub: 'user-alice' };
    const due = { accessToken: 'at-0', refreshToken: 'rt-0', expiresAt: Date.now() - 1000 };
    const left = await sessions.create({ user, tokens: due });
    const other = await sessions.create({ user, tokens: { ...due, expiresAt: Date.now() + 300_000 } });

    failing = true;
    try {
      const fresh = await refresher.fresh(left, (await sessions.get(left))!);
      expect(fresh?.tokens?.accessToken).toBe('at-1');
    } finally {
      failing = false;
    }
    expect(refresher.held()).toBe(1);
    // Its browser never comes back. Just short of the idle time, a request of another session keeps it.
    real += 1_800_000;
    await refresher.fresh(other, (await sessions.get(other))!);
    expect(refresher.held()).toBe(1);
    // Past it, the next request of another session finds it untouched for that long: it goes.
    real += 1;
    await refresher.fresh(other, (await sessions.get(other))!);
    expect(refresher.held()).toBe(0);
  });
});
