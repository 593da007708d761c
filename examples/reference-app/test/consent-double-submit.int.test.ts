// The consent form sent twice (a double click, a reload that posts it again): each POST saves a grant,
// then finishes the interaction. The first one to finish signs the person in with its grant; the
// other one must not leave a grant of its own behind, named by nothing until its 14-day TTL, nor undo
// the grant the first one made (a re-consent widens the person's existing grant: both POSTs save it).
//
// The second POST is held at its grant's save (a statement of the provider's database that waits for
// the test) while the first one finishes and the browser follows it back to the app, as a double
// click whose second request is slower does.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { storedId } from '../src/idp/stored-id.js';
import { databases } from './db-faults.js';
import { loginAndConsent } from './flow.js';
import { grantScope, narrowGrant, setGrantScope } from './grants.js';
import { alice } from './test-idp.js';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { createUserAgent, formAction, formField, type Step, type UserAgent } from './user-agent.js';

describe.each(databases)('the consent form sent twice, on %s', (_name, embedded) => {
  let stack: TwoAppStack;
  // When set, the next save of a grant waits for `release` (and says so through `reached`).
  let hold: { reached: () => void; release: Promise<void> } | undefined;
  // Each save of an Interaction that names a consent takes the first of these, if any, and waits for it:
  // a POST held past everything it read, just before its finish is stored.
  const finishHolds: Array<{ reached: () => void; release: Promise<void> }> = [];
  // When set, runs before each save of an Interaction that stores a cancel (given the row's id).
  let beforeCancel: ((rowId: string) => Promise<void>) | undefined;
  // When set, each save of a grant fails as a database that went away does (57P01).
  let grantSavesFail = false;

  beforeAll(async () => {
    stack = await startTwoAppStack({
      name: 'consent_twice',
      embedded,
      wrapIdpDb: (db): Database => ({
        ...db,
        query: async <Row>(text: string, params: readonly unknown[] = []) => {
          if (grantSavesFail && params[0] === 'Grant' && text.includes('insert into idp_models')) {
            throw Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' });
          }
          if (hold && params[0] === 'Grant' && text.includes('insert into idp_models')) {
            const held = hold;
            hold = undefined;
            held.reached();
            await held.release;
          }
          const finishing =
            params[0] === 'Interaction' &&
            text.includes('insert into idp_models') &&
            JSON.parse(String(params[2]))?.result?.consent !== undefined;
          const atFinish = finishing ? finishHolds.shift() : undefined;
          if (atFinish) {
            atFinish.reached();
            await atFinish.release;
          }
          const cancelling =
            params[0] === 'Interaction' &&
            text.includes('insert into idp_models') &&
            JSON.parse(String(params[2]))?.result?.error === 'access_denied';
          if (cancelling) await beforeCancel?.(params[1] as string);
          return db.query<Row>(text, params);
        },
      }),
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.close();
  });

  const signinUrl = () => new URL('/signin', stack.appUrls[0]).href;
  const callbackUrl = () => new URL('/callback', stack.appUrls[0]).href;
  const toApp = (url: string) => url.startsWith(callbackUrl());

  /**
   * Makes the interaction of the consent form at `action` name a grant that no longer exists, as a
   * POST leaves it whose finish was saved though the database answered an error (it deleted its grant).
   */
  const nameDeletedGrant = async (action: string) => {
    const uid = new URL(action).pathname.split('/')[2]!;
    const { rowCount } = await stack.dbs.one.query(
      `update idp_models set payload = jsonb_set(payload, '{result}', '{"consent":{"grantId":"deleted-grant"}}')
       where model = 'Interaction' and id = $1`,
      [storedId('Interaction', uid)],
    );
    expect(rowCount).toBe(1);
  };

  /** Ids of the app's grants (alice is the only one who signs in here). */
  const grantIds = async () =>
    (
      await stack.dbs.one.query<{ id: string }>(
        "select id from idp_models where model = 'Grant' and payload->>'clientId' = $1 order by id",
        [stack.client.clientId],
      )
    ).rows.map((row) => row.id);

  /** The grant the app's session was signed in with (its refresh token's). */
  const grantOfSession = async (agent: UserAgent) => {
    const id = agent.jar.cookies.get('app_session')?.value ?? '';
    const tokens = (await stack.sessions().get(id))?.tokens;
    expect(tokens?.refreshToken).toEqual(expect.any(String));
    const { rows } = await stack.dbs.one.query<{ grant_id: string }>(
      "select grant_id from idp_models where model = 'RefreshToken' and id = $1",
      [storedId('RefreshToken', tokens!.refreshToken!)],
    );
    return rows[0]?.grant_id;
  };

  /**
   * Follows an answer's `location` back to the app, whose sign-in completes, and expects the grant it
   * was signed in with to be the one grant made since `before`.
   */
  const expectSignedInWithOneNewGrant = async (agent: UserAgent, location: string | null, before: Set<string>) => {
    const back = await agent.follow(new URL(location!, stack.authUrl).href, toApp);
    expect(toApp(back.url)).toBe(true);
    expect((await agent.request(back.url)).response.status).toBe(303);
    const made = (await grantIds()).filter((id) => !before.has(id));
    expect(made).toHaveLength(1);
    expect(await grantOfSession(agent)).toBe(made[0]);
  };

  /** A browser at the consent page (`agent` signed in at the provider already, or a new one). */
  const atConsentPage = async (agent: UserAgent = createUserAgent()) => {
    let page = await agent.follow(signinUrl(), toApp);
    if (page.body.includes('<h1>Sign in</h1>')) {
      const login = await agent.postForm(new URL(formAction(page.body, 'login'), stack.authUrl).href, {
        csrf: formField(page.body, 'csrf'),
        username: alice.username,
        password: alice.password,
      });
      expect(login.response.status).toBe(303);
      page = await agent.follow(new URL(login.response.headers.get('location')!, stack.authUrl).href, toApp);
    }
    expect(page.body).toContain('<h1>Allow access</h1>');
    return {
      agent,
      fields: { csrf: formField(page.body, 'csrf') },
      action: new URL(formAction(page.body, 'consent'), stack.authUrl).href,
    };
  };

  /**
   * A browser back at the consent page of a re-consent: signed in once (its grant `id`, holding
   * `wide`), the grant then narrowed by `email`, which this consent asks for again.
   */
  const atReconsentPage = async () => {
    const agent = createUserAgent();
    const before = new Set(await grantIds());
    await loginAndConsent(agent, stack.authUrl, signinUrl(), callbackUrl(), alice);
    const [id, ...others] = (await grantIds()).filter((grant) => !before.has(grant));
    expect(others).toEqual([]);
    const wide = await grantScope(stack.dbs.one, id!);
    const narrow = await narrowGrant(stack.dbs.one, id!, 'email');
    const { fields, action } = await atConsentPage(agent);
    return { agent, id: id!, wide: wide!, narrow, fields, action };
  };

  /**
   * Sends Allow, holds it just before its finish is stored (it read the interaction and saved its
   * grant), sends Cancel meanwhile (stored first: 303), then lets Allow go on. `whileHeld` runs
   * before the Cancel.
   */
  const cancelWhileAllowHeld = async (
    agent: UserAgent,
    fields: Record<string, string>,
    action: string,
    whileHeld?: () => Promise<void>,
  ) => {
    const atFinish = gate();
    finishHolds.push(atFinish.hold);
    const allow = agent.postForm(action, fields);
    await atFinish.at;
    await whileHeld?.();
    const cancelled = await agent.postForm(action.replace(/\/consent$/, '/abort'), fields);
    expect(cancelled.response.status).toBe(303);
    atFinish.release();
    return { cancelled, refused: await allow };
  };

  /** Follows a Cancel's answer back to the app (access_denied); the next sign-in asks again. */
  const expectCancelledAndAskedAgain = async (agent: UserAgent, cancelled: Step) => {
    const back = await agent.follow(new URL(cancelled.response.headers.get('location')!, stack.authUrl).href, toApp);
    expect(new URL(back.url).searchParams.get('error')).toBe('access_denied');
    await agent.request(back.url);
    await atConsentPage(agent);
  };

  /** A point a POST waits at: `reached` once it is there, and it goes on when `release` is called. */
  const gate = () => {
    let reached!: () => void;
    let release!: () => void;
    const at = new Promise<void>((resolve) => {
      reached = resolve;
    });
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    return { at, release, hold: { reached, release: held } };
  };

  /**
   * Sends the form twice: the slower POST is held at its grant's save while the other one finishes
   * and the browser follows it back to the app (the sign-in completes); then the slower one goes on.
   */
  const sendTwice = async ({ agent, fields, action }: Awaited<ReturnType<typeof atConsentPage>>) => {
    const atGrantSave = gate();
    hold = atGrantSave.hold;
    const slower = agent.postForm(action, fields);
    await atGrantSave.at;
    const first = await agent.postForm(action, fields);
    expect(first.response.status).toBe(303);
    const back = await agent.follow(new URL(first.response.headers.get('location')!, stack.authUrl).href, toApp);
    expect(toApp(back.url)).toBe(true);
    const signedIn = await agent.request(back.url);
    expect(signedIn.response.status).toBe(303);
    atGrantSave.release();
    return { second: await slower };
  };

  it('leaves only the grant of the POST that finished first when the other one finishes too (side by side)', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const atGrantSave = gate();
    hold = atGrantSave.hold;
    const slower = agent.postForm(action, fields);
    await atGrantSave.at;
    const first = await agent.postForm(action, fields);
    expect(first.response.status).toBe(303);
    const made = (await grantIds()).filter((id) => !before.has(id));
    expect(made).toHaveLength(1);
    // The browser has not followed the first answer: the slower POST finds the interaction there.
    atGrantSave.release();
    const second = await slower;
    expect(second.response.status).toBe(303);
    expect(second.response.headers.get('location')).toBe(first.response.headers.get('location'));
    const back = await agent.follow(new URL(second.response.headers.get('location')!, stack.authUrl).href, toApp);
    expect(toApp(back.url)).toBe(true);
    expect((await agent.request(back.url)).response.status).toBe(303);
    expect((await grantIds()).filter((id) => !before.has(id))).toEqual(made);
    expect(await grantOfSession(agent)).toBe(made[0]);
  });

  it('leaves one grant when both POSTs read the interaction unfinished and both go to finish it', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    // Both POSTs saved their grants and read the interaction as nobody's yet; each is held just
    // before the save of the interaction that would name its grant.
    const first = gate();
    const second = gate();
    finishHolds.push(first.hold, second.hold);
    const firstPost = agent.postForm(action, fields);
    await first.at;
    const secondPost = agent.postForm(action, fields);
    await second.at;
    expect((await grantIds()).filter((id) => !before.has(id))).toHaveLength(2);
    first.release();
    const firstAnswer = await firstPost;
    expect(firstAnswer.response.status).toBe(303);
    second.release();
    const secondAnswer = await secondPost;
    expect(secondAnswer.response.status).toBe(303);
    expect(secondAnswer.response.headers.get('location')).toBe(firstAnswer.response.headers.get('location'));
    // The browser follows the first answer (the second is the same way on).
    await expectSignedInWithOneNewGrant(agent, firstAnswer.response.headers.get('location'), before);
  });

  it('leaves one grant when both POSTs past every read store their finish at the same moment', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const first = gate();
    const second = gate();
    finishHolds.push(first.hold, second.hold);
    const posts = [agent.postForm(action, fields), agent.postForm(action, fields)];
    await Promise.all([first.at, second.at]);
    // Both saves of the interaction sent at once (on PostgreSQL, on two connections side by side).
    first.release();
    second.release();
    const answers = await Promise.all(posts);
    expect(answers.map((answer) => answer.response.status)).toEqual([303, 303]);
    expect(answers[1]!.response.headers.get('location')).toBe(answers[0]!.response.headers.get('location'));
    await expectSignedInWithOneNewGrant(agent, answers[0]!.response.headers.get('location'), before);
  });

  it('goes on with a grant of its own when the interaction names a grant deleted since (its finish failed)', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    // As a POST leaves it whose interaction was saved though the database answered an error: the
    // interaction names that POST's grant, which it deleted.
    await nameDeletedGrant(action);
    const sent = await agent.postForm(action, fields);
    expect(sent.response.status).toBe(303);
    await expectSignedInWithOneNewGrant(agent, sent.response.headers.get('location'), before);
  });

  it('goes on with its own grant when another POST finished the interaction meanwhile and then deleted its grant', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const held = gate();
    finishHolds.push(held.hold);
    const post = agent.postForm(action, fields);
    await held.at;
    // Meanwhile another POST finished the interaction, but its database answered an error though the
    // save was made: it deleted its grant, which the interaction names.
    await nameDeletedGrant(action);
    held.release();
    const sent = await post;
    expect(sent.response.status).toBe(303);
    await expectSignedInWithOneNewGrant(agent, sent.response.headers.get('location'), before);
  });

  // Was wrong: Allow, at an interaction that names a grant deleted since, read it before Cancel stored
  // its cancel, and was refused (the cancel was stored first); its retry, meant for a deleted grant
  // named meanwhile, took the cancel (no grant named) for one and stored its finish over it: the later
  // stored word won, Allow's grant signed in the browser that followed Cancel. Decided: the finish
  // stored first under the compare-and-set wins; Allow answers its "Sign-in cancelled" page.
  it('cancels when Cancel is stored first while Allow, at an interaction naming a deleted grant, is on its way', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    await nameDeletedGrant(action);
    // Allow read the interaction and saved its grant, held just before its finish; Cancel is stored first.
    const { cancelled, refused } = await cancelWhileAllowHeld(agent, fields, action);
    expect(refused.response.status).toBe(400);
    expect(refused.response.headers.get('cache-control')).toBe('no-store');
    expect(refused.body).toContain('<h1>Sign-in cancelled</h1>');
    const back = await agent.follow(new URL(cancelled.response.headers.get('location')!, stack.authUrl).href, toApp);
    expect(toApp(back.url)).toBe(true);
    expect(new URL(back.url).searchParams.get('error')).toBe('access_denied');
    await agent.request(back.url);
    expect(agent.jar.cookies.get('app_session')).toBeUndefined();
    expect((await grantIds()).filter((id) => !before.has(id))).toEqual([]);
  });

  // Was wrong: "Allow", then "Cancel" before the browser followed Allow's answer (the cancel's finish
  // overwrites the consent's result): the sign-in was cancelled and Allow's new grant left named by
  // nothing until it expired. Decided: Cancel, the person's last word and the answer the browser
  // follows, wins; Allow's new grant is deleted.
  it('leaves no grant named by nothing when Cancel is sent after Allow, before the browser followed it', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const allowed = await agent.postForm(action, fields);
    expect(allowed.response.status).toBe(303);
    const cancelled = await agent.postForm(action.replace(/\/consent$/, '/abort'), fields);
    expect(cancelled.response.status).toBe(303);
    const back = await agent.follow(new URL(cancelled.response.headers.get('location')!, stack.authUrl).href, toApp);
    expect(toApp(back.url)).toBe(true);
    const landed = await agent.request(back.url);
    const made = (await grantIds()).filter((id) => !before.has(id));
    // Cancelled: no session at the app, and no new grant left.
    expect(landed.response.status === 303 && agent.jar.cookies.get('app_session')).toBeFalsy();
    expect(made).toEqual([]);
  });

  // Was wrong: Cancel sent while Allow was still on its way (both of one interaction at once) could
  // read the interaction unfinished, then store its cancel over Allow's finish: the sign-in was denied
  // and Allow's new grant left named by nothing until it expired.
  it('ends in one consistent state every time Allow and Cancel are sent at once', async () => {
    for (let round = 0; round < 20; round++) {
      const { agent, fields, action } = await atConsentPage();
      const before = new Set(await grantIds());
      const abort = action.replace(/\/consent$/, '/abort');
      // Either one sent first, in turn: which one the provider reads first is left to the race.
      const [allowed, cancelled] =
        round % 2 === 0
          ? await Promise.all([agent.postForm(action, fields), agent.postForm(abort, fields)])
          : await Promise.all([agent.postForm(abort, fields), agent.postForm(action, fields)]).then(([c, a]) => [a, c]);
      expect(cancelled!.response.status).toBe(303);
      // Allow refused because the cancel was stored first (after Allow read the interaction) answers
      // its lost-the-race page; otherwise the same way on as Cancel.
      if (allowed!.response.status === 400) {
        expect(allowed!.body).toContain('<h1>Sign-in cancelled</h1>');
      } else {
        expect(allowed!.response.status).toBe(303);
        expect(cancelled!.response.headers.get('location')).toBe(allowed!.response.headers.get('location'));
      }
      const back = await agent.follow(new URL(cancelled!.response.headers.get('location')!, stack.authUrl).href, toApp);
      expect(toApp(back.url)).toBe(true);
      const denied = new URL(back.url).searchParams.get('error');
      const landed = await agent.request(back.url);
      const made = (await grantIds()).filter((id) => !before.has(id));
      if (denied === null) {
        expect(allowed!.response.status).toBe(303);
        // Allow won: one grant, and the app signed in with it.
        expect(landed.response.status).toBe(303);
        expect(made).toHaveLength(1);
        expect(await grantOfSession(agent)).toBe(made[0]);
      } else {
        // Cancel won: no new grant left, no session at the app. (Seen once under heavy load, never
        // reproduced in 560 rounds since: a new grant left behind a denied sign-in. The message says
        // what the grant holds and when it was made, should it come again.)
        expect(denied).toBe('access_denied');
        expect(agent.jar.cookies.get('app_session')).toBeUndefined();
        const left = made.length
          ? (
              await stack.dbs.one.query(
                "select id, payload, expires_at from idp_models where model = 'Grant' and id = any($1)",
                [made],
              )
            ).rows
          : [];
        expect(
          made,
          `round ${round} (${round % 2 === 0 ? 'Allow' : 'Cancel'} sent first): ${JSON.stringify(left)}`,
        ).toEqual([]);
      }
    }
  }, 120_000);

  // Was wrong: Allow sent again after Allow finished (a double click, its answer not followed yet)
  // reads the first Allow's grant and finished naming it whatever the interaction named by then. A
  // Cancel that came in between stored its cancel and deleted that grant; the second Allow's finish
  // then overwrote the cancel, naming the deleted grant: the browser, following Cancel's answer, was
  // shown the consent page again instead of the cancel (the person's last word).
  it('cancels when Cancel comes between a finished Allow and the same Allow sent again', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const allowed = await agent.postForm(action, fields);
    expect(allowed.response.status).toBe(303);
    // The same form sent again: it reads the first Allow's grant, and is held just before its finish.
    const { cancelled, refused } = await cancelWhileAllowHeld(agent, fields, action);
    // Was wrong: the Allow sent again, refused since the Cancel won, answered "Sign-in expired: This
    // sign-in link is no longer valid", while the sign-in was there, cancelled. Decided: its page says
    // that. The browser follows the last form sent.
    expect(refused.response.status).toBe(400);
    expect(refused.response.headers.get('cache-control')).toBe('no-store');
    expect(refused.body).not.toContain('Sign-in expired');
    expect(refused.body).toContain('<h1>Sign-in cancelled</h1>');
    expect(refused.body).toContain(
      '<p>This sign-in was cancelled in another tab or window, so it was not allowed. Go back to the application.</p>',
    );
    const back = await agent.follow(new URL(cancelled.response.headers.get('location')!, stack.authUrl).href, toApp);
    expect(toApp(back.url)).toBe(true);
    expect(new URL(back.url).searchParams.get('error')).toBe('access_denied');
    await agent.request(back.url);
    expect(agent.jar.cookies.get('app_session')).toBeUndefined();
    expect((await grantIds()).filter((id) => !before.has(id))).toEqual([]);
  });

  // Was wrong: the Allow refused because another consent finished the sign-in since answered "Sign-in
  // expired", while the sign-in was there, allowed by that consent. Decided: the page says that.
  it('answers the Allow that another consent beat with a page that says the sign-in was already allowed', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const allowed = await agent.postForm(action, fields);
    expect(allowed.response.status).toBe(303);
    const made = (await grantIds()).filter((id) => !before.has(id));
    expect(made).toHaveLength(1);
    // The same form sent again is held just before its finish, while another consent finishes the
    // interaction naming a grant of its own.
    const atFinish = gate();
    finishHolds.push(atFinish.hold);
    const again = agent.postForm(action, fields);
    await atFinish.at;
    const uid = new URL(action).pathname.split('/')[2]!;
    const { rowCount } = await stack.dbs.one.query(
      `update idp_models set payload = jsonb_set(payload, '{result,consent,grantId}', '"another-grant"')
       where model = 'Interaction' and id = $1`,
      [storedId('Interaction', uid)],
    );
    expect(rowCount).toBe(1);
    atFinish.release();
    const refused = await again;
    expect(refused.response.status).toBe(400);
    expect(refused.response.headers.get('cache-control')).toBe('no-store');
    expect(refused.body).not.toContain('Sign-in expired');
    expect(refused.body).toContain('<h1>Already allowed</h1>');
    expect(refused.body).toContain(
      '<p>This sign-in was already allowed in another tab or window. Go back to the application.</p>',
    );
    expect((await grantIds()).filter((id) => !before.has(id))).toEqual(made);
  });

  it('answers a Cancel sent once Allow was followed (the sign-in done) with a page, leaving the sign-in and its grant', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const allowed = await agent.postForm(action, fields);
    await expectSignedInWithOneNewGrant(agent, allowed.response.headers.get('location'), before);
    const made = (await grantIds()).filter((id) => !before.has(id));
    const cancelled = await agent.postForm(action.replace(/\/consent$/, '/abort'), fields);
    expect(cancelled.response.status).toBe(400);
    expect(cancelled.body).toContain('Sign-in expired');
    expect((await grantIds()).filter((id) => !before.has(id))).toEqual(made);
    expect(await grantOfSession(agent)).toBe(made[0]);
  });

  // Was wrong: the Cancel that gave up answered "Sign-in expired: This sign-in link is no longer valid",
  // while the sign-in was there, allowed by the consent that won. Decided: the page says that.
  it('answers a Cancel that another consent beat three times with a page that says the sign-in was allowed, leaving the grant that consent named', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const allowed = await agent.postForm(action, fields);
    expect(allowed.response.status).toBe(303);
    const [made] = (await grantIds()).filter((id) => !before.has(id));
    // Before each of the Cancel's saves, the interaction is finished again naming another grant, as
    // one more consent finishing it in between would.
    let beaten = 0;
    beforeCancel = async (rowId) => {
      beaten++;
      await stack.dbs.one.query(
        `update idp_models set payload = jsonb_set(payload, '{result,consent,grantId}', to_jsonb($2::text))
         where model = 'Interaction' and id = $1`,
        [rowId, beaten % 2 === 1 ? 'another-grant' : made],
      );
    };
    try {
      const cancelled = await agent.postForm(action.replace(/\/consent$/, '/abort'), fields);
      expect(beaten).toBe(3);
      expect(cancelled.response.status).toBe(400);
      expect(cancelled.response.headers.get('cache-control')).toBe('no-store');
      expect(cancelled.body).not.toContain('Sign-in expired');
      expect(cancelled.body).toContain('<h1>Already allowed</h1>');
      expect(cancelled.body).toContain(
        '<p>This sign-in was already allowed in another tab or window, so it was not cancelled. Go back to the application.</p>',
      );
    } finally {
      beforeCancel = undefined;
    }
    expect((await grantIds()).filter((id) => !before.has(id))).toEqual([made]);
  });

  it("leaves only the grant of the POST that finished, not the other's new grant", async () => {
    const consent = await atConsentPage();
    const before = new Set(await grantIds());
    const { second } = await sendTwice(consent);
    // The page the second POST got before: the interaction is gone, the sign-in link expired.
    expect(second.response.status).toBe(400);
    expect(second.body).toContain('Sign-in expired');
    const made = (await grantIds()).filter((id) => !before.has(id));
    expect(made).toEqual([await grantOfSession(consent.agent)]);
  });

  it('keeps the grant the first POST widened as it widened it (a re-consent sent twice)', async () => {
    // The grant as if alice had never allowed `email`: the next consent adds it to this grant.
    const consent = await atReconsentPage();
    const { agent, id } = consent;
    const before = new Set(await grantIds());
    const scopeOf = () => grantScope(stack.dbs.one, id);
    const { second } = await sendTwice(consent);
    expect(second.response.status).toBe(400);
    expect(await grantOfSession(agent)).toBe(id);
    expect((await scopeOf())?.split(' ')).toContain('email');
    // Both POSTs widened the one grant: none was made.
    expect((await grantIds()).filter((grant) => !before.has(grant))).toEqual([]);
  });

  // Was wrong: at a re-consent (the grant lacks `email`), Allow widened the person's grant, then Cancel,
  // sent before the browser followed Allow, cancelled the sign-in but left the grant widened: the
  // next sign-in of that app went through with `email` and no consent page, though the person's last
  // word on it was Cancel.
  it('takes back what Allow added to the grant when Cancel is sent after it (a re-consent)', async () => {
    const { agent, id, narrow, fields, action } = await atReconsentPage();
    const allowed = await agent.postForm(action, fields);
    expect(allowed.response.status).toBe(303);
    expect((await grantScope(stack.dbs.one, id))?.split(' ')).toContain('email');
    const cancelled = await agent.postForm(action.replace(/\/consent$/, '/abort'), fields);
    expect(cancelled.response.status).toBe(303);
    expect(await grantScope(stack.dbs.one, id)).toBe(narrow);
    await expectCancelledAndAskedAgain(agent, cancelled);
  });

  // Was wrong: the same, with Cancel stored first while Allow (which had widened the grant) was on its
  // way to finish: Allow, refused, kept the grant widened, as if another Allow had finished naming it.
  it('takes back what Allow added to the grant when Cancel is stored first while Allow is on its way (a re-consent)', async () => {
    const { agent, id, narrow, fields, action } = await atReconsentPage();
    const { cancelled, refused } = await cancelWhileAllowHeld(agent, fields, action, async () => {
      expect((await grantScope(stack.dbs.one, id))?.split(' ')).toContain('email');
    });
    expect(refused.response.status).toBe(400);
    expect(refused.body).toContain('<h1>Sign-in cancelled</h1>');
    expect(await grantScope(stack.dbs.one, id)).toBe(narrow);
    await expectCancelledAndAskedAgain(agent, cancelled);
  });

  // Was wrong: the same, with the database failing the take-back: the Cancel was stored and answered
  // as any Cancel (303 on to the app, access_denied) before the take-back, which failed in silence;
  // the grant stayed widened and the next sign-in of that app got `email` with no consent page. Now
  // the take-back comes before the answer: its failure is the 503 page that says what was allowed may
  // have been kept, and the same Cancel sent again, with the database back, takes it back.
  it('answers 503 when taking back what Allow added fails, and the same Cancel sent again takes it back (a re-consent)', async () => {
    const { agent, id, narrow, fields, action } = await atReconsentPage();
    const allowed = await agent.postForm(action, fields);
    expect(allowed.response.status).toBe(303);
    const abort = action.replace(/\/consent$/, '/abort');
    grantSavesFail = true;
    let failed: Awaited<ReturnType<UserAgent['postForm']>>;
    try {
      failed = await agent.postForm(abort, fields);
    } finally {
      grantSavesFail = false;
    }
    expect(failed.response.status).toBe(503);
    expect(failed.response.headers.get('retry-after')).not.toBeNull();
    expect(failed.response.headers.get('cache-control')).toBe('no-store');
    expect(failed.body).toContain('may have been kept');
    expect(await grantScope(stack.dbs.one, id)).not.toBe(narrow);
    const cancelled = await agent.postForm(abort, fields);
    expect(cancelled.response.status).toBe(303);
    expect(await grantScope(stack.dbs.one, id)).toBe(narrow);
    await expectCancelledAndAskedAgain(agent, cancelled);
  });

  // A plain Cancel of a re-consent (no Allow before it) leaves the grant as it is: what the consent
  // would add is taken back only after an Allow of this interaction, or by a Cancel sent again. A
  // scope another sign-in allowed meanwhile stays.
  it('leaves the grant alone on a plain Cancel of a re-consent, scopes allowed elsewhere meanwhile included', async () => {
    const { id, wide, action, fields, agent } = await atReconsentPage();
    // Another sign-in of the same grant allowed `email` since this consent page was shown.
    await setGrantScope(stack.dbs.one, id, wide);
    const cancelled = await agent.postForm(action.replace(/\/consent$/, '/abort'), fields);
    expect(cancelled.response.status).toBe(303);
    expect(await grantScope(stack.dbs.one, id)).toBe(wide);
  });

  // A consent page left open while the person signed out at the provider (another tab): its Allow
  // must not save a grant for the account that signed out, nor go on signed in.
  it('refuses Allow and Cancel sent from a consent page left open over a sign-out at the provider', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const confirm = await agent.request(new URL('/session/end', stack.authUrl).href);
    const end = /<form id="op.logoutForm" method="post" action="([^"]+)"/.exec(confirm.body)?.[1];
    const signedOut = await agent.postForm(new URL(end!, stack.authUrl).href, {
      xsrf: formField(confirm.body, 'xsrf'),
      logout: 'yes',
    });
    expect(signedOut.response.status).toBe(303);
    for (const form of [action, action.replace(/\/consent$/, '/abort')]) {
      const stale = await agent.postForm(form, fields);
      expect(stale.response.status).toBe(400);
      expect(stale.response.headers.get('cache-control')).toBe('no-store');
      expect(stale.body).toContain('Sign-in expired');
    }
    expect((await grantIds()).filter((id) => !before.has(id))).toEqual([]);
  });

  it('answers a second POST that comes once the first finished, before the browser followed it, with the same way on', async () => {
    const { agent, fields, action } = await atConsentPage();
    const before = new Set(await grantIds());
    const first = await agent.postForm(action, fields);
    expect(first.response.status).toBe(303);
    const made = (await grantIds()).filter((id) => !before.has(id));
    expect(made).toHaveLength(1);
    const second = await agent.postForm(action, fields);
    expect(second.response.status).toBe(303);
    expect(second.response.headers.get('location')).toBe(first.response.headers.get('location'));
    const back = await agent.follow(new URL(second.response.headers.get('location')!, stack.authUrl).href, toApp);
    expect(toApp(back.url)).toBe(true);
    expect((await agent.request(back.url)).response.status).toBe(303);
    expect((await grantIds()).filter((id) => !before.has(id))).toEqual(made);
    expect(await grantOfSession(agent)).toBe(made[0]);
  });
});
