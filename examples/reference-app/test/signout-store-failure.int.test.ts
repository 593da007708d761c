// Sign-out while the app's database fails: the session could not be taken, so nothing was done, and
// the person must be able to try again. DESIGN.md's HTTP table: never a 500 for a store that failed,
// a 503 with Retry-After; for the browser's form post, an HTML page, and the session cookie kept (the
// session is still there, with its tokens, and the next try signs out and revokes them).
//
// The fault is the database's own: the statement that takes the session is replaced by one the database
// refuses with the error of a connection terminated by the server (57P01), on PGlite and PostgreSQL;
// or it runs, commits, and that error comes back in place of its answer (a connection lost after the commit).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { databases, terminated } from './db-faults.js';
import { introspect } from './flow.js';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { formField } from './user-agent.js';

/** The statement that takes a session on sign-out (sessions.ts, `take`). */
const takesSession = (text: string) => text.trim() === 'delete from app_sessions where id_hash = $1 returning data';

describe.each(databases)('sign-out while the database fails, on %s', (_name, embedded) => {
  let stack: TwoAppStack;
  /** While true, the first process's database refuses to take a session. */
  let failing = false;
  /** While true, it takes the session and then loses the answer (the connection ends after the commit). */
  let answerLost = false;

  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'signout_store',
      embedded,
      wrapDb: (db, i): Database =>
        i === 1
          ? db
          : {
              ...db,
              query: async <Row>(text: string, params: readonly unknown[] = []) => {
                if (failing && takesSession(text)) return db.query<Row>(terminated);
                if (answerLost && takesSession(text)) {
                  await db.query<Row>(text, params);
                  return db.query<Row>(terminated);
                }
                return db.query<Row>(text, params);
              },
            },
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
  });

  const signOut = (cookie: string, csrf: string) =>
    fetch(new URL('/signout', stack.appUrls[0]).href, {
      method: 'POST',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ csrf }),
      redirect: 'manual',
    });

  it('answers 503 with Retry-After and a page, keeps the session and its cookie, and the next try signs out', async () => {
    const { id, tokens, agent } = await stack.signIn();
    const page = await agent.request(new URL('/', stack.appUrls[0]).href);
    const cookie = agent.jar.header();
    const csrf = formField(page.body, 'csrf');
    failing = true;
    let answer: Response;
    try {
      answer = await signOut(cookie, csrf);
    } finally {
      failing = false;
    }
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(answer.headers.get('content-type')).toMatch(/^text\/html/);
    expect(answer.headers.get('cache-control')).toBe('no-store');
    expect(await answer.text()).toContain('You are still signed in');
    // The session cookie is not cleared: the session is there, and the person tries again with it.
    expect(answer.headers.getSetCookie().filter((line) => line.startsWith('app_session='))).toEqual([]);
    expect((await stack.sessions().get(id))?.tokens).toEqual(tokens);
    expect(await introspect(stack.authUrl, tokens.refreshToken!, stack.client)).toMatchObject({ active: true });

    // The database is back: the same form signs out, and the tokens are revoked.
    const again = await signOut(cookie, csrf);
    expect(again.status).toBe(303);
    expect(await stack.sessions().get(id)).toBeUndefined();
    expect(await introspect(stack.authUrl, tokens.refreshToken!, stack.client)).toMatchObject({ active: false });
  });

  /** Signs out once with the answer of the take lost, and the same form again; both answers. */
  const signOutAnswerLost = async () => {
    const { id, tokens, agent } = await stack.signIn();
    const page = await agent.request(new URL('/', stack.appUrls[0]).href);
    const cookie = agent.jar.header();
    const csrf = formField(page.body, 'csrf');
    answerLost = true;
    let first: Response;
    try {
      first = await signOut(cookie, csrf);
    } finally {
      answerLost = false;
    }
    return { id, tokens, first, again: await signOut(cookie, csrf) };
  };

  it('signs out on the retry of a sign-out whose take committed but whose answer was lost', async () => {
    const { id, first, again } = await signOutAnswerLost();
    // The app cannot tell a lost answer from a failed statement: the first page says what a failed one means.
    expect(first.status).toBe(503);
    expect(await first.text()).toContain('You are still signed in');
    expect(await stack.sessions().get(id)).toBeUndefined();
    // The same form again finds no session: the browser goes on to the provider's logout, the cookie cleared.
    expect(again.status).toBe(303);
    expect(new URL(again.headers.get('location') ?? '').origin).toBe(new URL(stack.authUrl).origin);
    expect(again.headers.getSetCookie().some((line) => /^app_session=;.*Max-Age=0/i.test(line))).toBe(true);
  });
});
