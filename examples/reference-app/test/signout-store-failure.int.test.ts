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
import { hashOf, startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { formField } from './user-agent.js';

/** The statement that takes a session on sign-out and on "Sign in again" (sessions.ts, `take`). */
const takesSession = (text: string) => text.trim() === 'delete from app_sessions where id_hash = $1 returning data';
/** The statement that takes a session ended by its time, found so by a request (sessions.ts, `takeEnded`). */
const takesEnded = (text: string) =>
  text.trim().startsWith("delete from app_sessions where id_hash = $1 and data ? 'user' and not (");

describe.each(databases)('sign-out while the database fails, on %s', (_name, embedded) => {
  let stack: TwoAppStack;
  /** While true, the first process's database refuses to take a session. */
  let failing = false;
  /** The statement it runs and then loses the answer of (the connection ends after the commit), if any. */
  let answerLost: ((text: string) => boolean) | undefined;

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
                if (answerLost?.(text)) {
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
    answerLost = takesSession;
    let first: Response;
    try {
      first = await signOut(cookie, csrf);
    } finally {
      answerLost = undefined;
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

  // The same lost answer where a session ends otherwise, README: "A sign-out (or a new sign-in, or the
  // first request that finds the session ended by its time) whose delete committed but whose answer the
  // database lost took the tokens with the row: nothing revokes them then, and the grant ends with its
  // 12 hours". Without the fault, each revokes them as sign-out does (app.int.test.ts,
  // sign-in-lifetime.audit.int.test.ts); with it, the app cannot tell the tokens are gone.
  /** Runs `request` with the answer of the statement `which` picks lost. */
  const losing = async <T>(which: (text: string) => boolean, request: () => Promise<T>): Promise<T> => {
    answerLost = which;
    try {
      return await request();
    } finally {
      answerLost = undefined;
    }
  };

  it('leaves the grant of a "Sign in again" whose take committed but whose answer was lost, and the retry starts the sign-in', async () => {
    const { id, tokens, agent } = await stack.signIn();
    const ask = await agent.request(new URL('/signin', stack.appUrls[0]).href);
    const cookie = agent.jar.header();
    const send = () =>
      fetch(new URL('/signin', stack.appUrls[0]).href, {
        method: 'POST',
        headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ csrf: formField(ask.body, 'csrf'), return_to: '/' }),
        redirect: 'manual',
      });
    const first = await losing(takesSession, send);
    expect(first.status).toBe(503);
    expect(await stack.sessions().get(id)).toBeUndefined();
    expect(await introspect(stack.authUrl, tokens.refreshToken!, stack.client)).toMatchObject({ active: true });
    const again = await send();
    expect(again.status).toBe(303);
    expect(new URL(again.headers.get('location') ?? '').origin).toBe(new URL(stack.authUrl).origin);
    // Held by no one: the grant ends with its 12 hours.
    expect(await introspect(stack.authUrl, tokens.refreshToken!, stack.client)).toMatchObject({ active: true });
  });

  it('leaves the grant of a session ended by its time whose take committed but whose answer was lost, and the retry shows the signed-out page', async () => {
    const { id, tokens, cookie } = await stack.signIn();
    // 12 hours and a minute after the sign-in (and the password): ended by its lifetime.
    await stack.dbs.one.query(
      `update app_sessions set created_at = created_at - interval '721 minutes',
          data = jsonb_set(data, '{authTime}', to_jsonb((data ->> 'authTime')::bigint - 43260))
        where id_hash = $1`,
      [hashOf(id)],
    );
    const open = () => fetch(new URL('/', stack.appUrls[0]).href, { headers: { cookie }, redirect: 'manual' });
    const first = await losing(takesEnded, open);
    expect(first.status).toBe(503);
    const { rows } = await stack.dbs.one.query('select 1 from app_sessions where id_hash = $1', [hashOf(id)]);
    expect(rows).toEqual([]);
    const again = await open();
    expect(again.status).toBe(200);
    expect(await again.text()).toContain('<a href="/signin">Sign in</a>');
    expect(again.headers.getSetCookie().some((line) => /^app_session=;.*Max-Age=0/i.test(line))).toBe(true);
    expect(await introspect(stack.authUrl, tokens.refreshToken!, stack.client)).toMatchObject({ active: true });
  });
});
