// A signed-in session that ended by its time (idle, or past its lifetime) still holds tokens, which
// the app revokes at the provider when a request finds it ended. Of several requests that find it so
// at once (tabs reloading, two app processes behind one load balancer, a sign-out racing a page), one
// must revoke: `SessionStore.takeEnded` claims the row with one DELETE ... RETURNING. Real concurrency
// on the real databases (the embedded PGlite, and PostgreSQL when DATABASE_URL is set, through two
// pools); the database's clock cannot be moved, so the rows are aged instead.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { migrateApp } from '../src/app/schema.js';
import { createSessionStore, type NewSessionData } from '../src/app/sessions.js';
import type { Database } from '../src/db.js';
import { introspect } from './flow.js';
import { openTestDatabaseTwice, type TwoHandles } from './services.js';
import { hashOf, startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { formField } from './user-agent.js';

const callers = 20;

/** Moves every time of the session row `seconds` back, as if that much time had passed. */
const age = (db: Database, id: string, seconds: number) =>
  db.query(
    `update app_sessions set created_at = created_at - make_interval(secs => $2),
        expires_at = expires_at - make_interval(secs => $2), last_seen = last_seen - make_interval(secs => $2)
      where id_hash = $1`,
    [hashOf(id), seconds],
  );

// The embedded store always; PostgreSQL too when DATABASE_URL is set.
const stores: Array<[string, () => Promise<TwoHandles>]> = [
  ['the embedded PGlite', () => openTestDatabaseTwice('ended_store', { embedded: true })],
];
if (process.env.DATABASE_URL)
  stores.push(['PostgreSQL, through two pools', () => openTestDatabaseTwice('ended_store')]);

describe.each(stores)('takeEnded on %s', (_name, open) => {
  let dbs: TwoHandles;
  beforeAll(async () => {
    dbs = await open();
    await migrateApp(dbs.one);
  }, 60_000);
  afterAll(async () => {
    await dbs?.close();
  });

  const signedIn: NewSessionData = {
    user: { sub: 'alice' },
    tokens: { accessToken: 'access', refreshToken: 'refresh', expiresAt: 0 },
  };

  it.each([
    ['idle', 31 * 60],
    ['past its lifetime', 12 * 3600 + 1],
  ])(`gives a session ended (%s) to exactly one of ${callers} concurrent callers`, async (_why, seconds) => {
    const options = { ttlSeconds: 8 * 3600, lifetimeSeconds: 12 * 3600, idleSeconds: 30 * 60 };
    const first = createSessionStore(dbs.one, options);
    const second = createSessionStore(dbs.two, options);
    const id = await first.create(signedIn);
    await age(dbs.one, id, seconds);
    const taken = await Promise.all(
      Array.from({ length: callers }, (_, i) => (i % 2 === 0 ? first : second).takeEnded(id)),
    );
    expect(taken.filter((data) => data !== undefined)).toEqual([signedIn]);
    expect(await first.takeEnded(id)).toBeUndefined();
  });

  it('gives nothing for a live session, and leaves it live', async () => {
    const store = createSessionStore(dbs.one, { ttlSeconds: 3600 });
    const id = await store.create(signedIn);
    const taken = await Promise.all(Array.from({ length: callers }, () => store.takeEnded(id)));
    expect(taken.every((data) => data === undefined)).toBe(true);
    expect(await store.get(id)).toEqual(signedIn);
  });
});

/** The next statement of the second app that `match` picks: it runs, then its answer waits for `release`. */
let held:
  | { match: (text: string, params: readonly unknown[]) => boolean; reached: () => void; opened: Promise<void> }
  | undefined;
function holdAfter(match: (text: string, params: readonly unknown[]) => boolean) {
  let release = () => {};
  const opened = new Promise<void>((resolve) => {
    release = resolve;
  });
  const reached = new Promise<void>((resolve) => {
    held = { match, reached: resolve, opened };
  });
  return { reached, release };
}
const gated = (inner: Database): Database => ({
  ...inner,
  async query<Row>(text: string, params: readonly unknown[] = []) {
    const hold = held;
    if (!hold?.match(text, params)) return inner.query<Row>(text, params);
    held = undefined;
    const result = await inner.query<Row>(text, params);
    hold.reached();
    await hold.opened;
    return result;
  },
});

/**
 * A provider, and the app twice (as two processes behind one address, each on its own pool when on
 * PostgreSQL), counting the revocation requests the provider gets.
 */
let stack: TwoAppStack;
let revocations = 0;

beforeAll(async () => {
  stack = await startTwoAppStack({
    name: 'ended_http',
    authMiddleware: (provider) => (req, res) => {
      if (req.method === 'POST' && req.url?.startsWith('/token/revocation')) revocations++;
      provider(req, res);
    },
    wrapDb: (db, i) => (i === 1 ? gated(db) : db),
    // No API (a port nothing listens on) and no stock to show: these tests need none.
    app: () => ({ baseUrl: 'http://127.0.0.1:1', resource: undefined, stockItems: undefined }),
  });
}, 120_000);

afterAll(async () => {
  await stack?.close();
});

beforeEach(() => {
  revocations = 0;
});

/** Signs alice in; returns the session id, the cookie header and a CSRF token of the signed-in page. */
async function signIn() {
  const { id, tokens, agent } = await stack.signIn();
  const page = await agent.request(new URL('/', stack.appUrls[0]).href);
  expect(page.body).toContain('Alice');
  revocations = 0;
  // The cookies as the signed-in page left them: it sets the CSRF cookie its form's token goes with.
  return { id, cookie: agent.jar.header(), csrf: formField(page.body, 'csrf'), tokens };
}

/** GET / at app `i` (of two) with the browser's cookies. */
const page = (i: number, cookie: string) => stack.page(i % 2 === 0 ? 0 : 1, cookie);
const signOut = (i: number, cookie: string, csrf: string) =>
  fetch(new URL('/signout', stack.appUrls[i % 2]!).href, {
    method: 'POST',
    headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ csrf }),
    redirect: 'manual',
  });
const active = async (token: string) => (await introspect(stack.authUrl, token, stack.client)).active;

describe('a timed-out session, found so by concurrent requests', () => {
  it(`is revoked at the provider once for ${callers} concurrent pages on two app processes`, async () => {
    const { id, cookie, tokens } = await signIn();
    await age(stack.dbs.one, id, 31 * 60);
    const pages = await Promise.all(Array.from({ length: callers }, (_, i) => page(i, cookie)));
    for (const answer of pages) {
      expect(answer.status).toBe(200);
      expect(answer.body).not.toContain('Alice');
    }
    // One revocation: its refresh token and its access token, one request each.
    expect(revocations).toBe(2);
    expect(await active(tokens.refreshToken!)).toBe(false);
  });

  it('is revoked once when sign-out races pages of the same session', async () => {
    const { id, cookie, csrf, tokens } = await signIn();
    await age(stack.dbs.one, id, 31 * 60);
    const answers = await Promise.all([
      ...Array.from({ length: callers / 2 }, (_, i) => page(i, cookie).then((answer) => answer.status)),
      ...Array.from({ length: callers / 2 }, (_, i) => signOut(i, cookie, csrf).then((response) => response.status)),
    ]);
    expect(answers.every((status) => status === 200 || status === 303)).toBe(true);
    expect(revocations).toBe(2);
    expect(await active(tokens.refreshToken!)).toBe(false);
  });
});

describe('a live session', () => {
  // Was wrong: sign-out read the session, then deleted it. A page of the session that came in between,
  // just as it timed out, took it as ended and revoked its tokens, and the sign-out revoked them again.
  it('is revoked once when it times out between the sign-out and a page', async () => {
    const { id, cookie, csrf, tokens } = await signIn();
    // The sign-out's first statement on the session runs on a live session; its answer is held.
    const gate = holdAfter((text, params) => text.includes('app_sessions') && params[0] === hashOf(id));
    const signingOut = signOut(1, cookie, csrf);
    await gate.reached;
    await age(stack.dbs.one, id, 31 * 60);
    const between = await page(0, cookie);
    expect(between.body).not.toContain('Alice');
    gate.release();
    expect((await signingOut).status).toBe(303);
    expect(revocations).toBe(2);
    expect(await active(tokens.refreshToken!)).toBe(false);
  });

  it('is revoked once when sign-out races pages of the same session', async () => {
    const { cookie, csrf, tokens } = await signIn();
    await Promise.all([...Array.from({ length: callers / 2 }, (_, i) => page(i, cookie)), signOut(0, cookie, csrf)]);
    expect(revocations).toBe(2);
    expect(await active(tokens.refreshToken!)).toBe(false);
  });

  it('is revoked once when sign-out is sent several times at once (a double click, two processes)', async () => {
    const { cookie, csrf, tokens } = await signIn();
    const answers = await Promise.all(Array.from({ length: 4 }, (_, i) => signOut(i, cookie, csrf)));
    expect(answers.map((response) => response.status)).toEqual([303, 303, 303, 303]);
    expect(revocations).toBe(2);
    expect(await active(tokens.refreshToken!)).toBe(false);
  });
});

describe('a live session replaced by a new sign-in', () => {
  it('is revoked once when "Sign in" is sent several times at once', async () => {
    const { cookie, csrf, tokens } = await signIn();
    const answers = await Promise.all(
      Array.from({ length: 4 }, (_, i) =>
        fetch(new URL('/signin', stack.appUrls[i % 2]!).href, {
          method: 'POST',
          headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
          body: new URLSearchParams({ csrf, return_to: '/' }),
          redirect: 'manual',
        }),
      ),
    );
    expect(answers.map((response) => response.status)).toEqual([303, 303, 303, 303]);
    expect(revocations).toBe(2);
    expect(await active(tokens.refreshToken!)).toBe(false);
  });
});
