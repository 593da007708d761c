// "Create charge" when the app's database fails after the charge went to the API, so the app cannot
// keep or show what came of it. Its 503 page says what the app knows of it on that request:
// - the answer was lost (the charge may have been created): the outcome is not known, and the page
//   offers the same charge again, with the same Idempotency-Key, amount and currency (and the session's
//   CSRF token, which takes no database); sent once the database is back, the API replays its first
//   charge: one charge at the API, not two (spec 2.1: the same key on every retry);
// - the API answered 2xx: the charge was created, and the page says so, with nothing to send again;
// - the API refused it (a 4xx on every attempt, its key standing for another charge too): nothing
//   was charged, and the page offers no same charge again (it would be refused again).
//
// The API is the real one (gateway, API on the file's database), trusting the provider of the stack.
// The app's database fails from the moment the gateway answers the charge: a listener that runs before
// the gateway's own turns the fault on as the answer is written (or, `loseAnswer`, cuts the connection
// instead of answering: the charge ran at the API, its answer never reaches the app), so the app meets
// it on its next statement (keeping the outcome for the page), never earlier.
import type { ServerResponse } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { maxChargeAmount } from '../src/api/charges.js';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { type ListeningPort, listen } from '../src/listen.js';
import { databases, terminated } from './db-faults.js';
import { startTwoAppStack, type TwoAppStack } from './two-app-stack.js';
import { formField } from './user-agent.js';

describe.each(databases)('a charge whose outcome the app could not keep, on %s', (_name, embedded) => {
  let stack: TwoAppStack;
  let gatewayPort: ListeningPort;
  let resources: RunningResourceStack | undefined;
  /** Set: the app's statements fail as on a terminated connection. */
  let down = false;
  /** Set: the gateway's answer to the next POST /charges turns `down` on. */
  let downOnCharge = false;
  /** With `downOnCharge`: the gateway's answer is not sent, its connection cut instead. */
  let loseAnswer = false;

  beforeAll(async () => {
    gatewayPort = await listen(0);
    gatewayPort.server.prependListener('request', (req, res: ServerResponse) => {
      if (!downOnCharge || req.method !== 'POST' || !req.url?.startsWith('/charges')) return;
      if (loseAnswer) {
        const cut = () => {
          down = true;
          res.socket?.destroy();
          return res;
        };
        res.writeHead = cut as typeof res.writeHead;
        res.write = (() => true) as typeof res.write;
        res.end = cut as typeof res.end;
        return;
      }
      const end = res.end.bind(res) as (...args: unknown[]) => ServerResponse;
      res.end = ((...args: unknown[]) => {
        down = true;
        return end(...args);
      }) as typeof res.end;
    });
    stack = await startTwoAppStack({
      name: 'charge_store',
      embedded,
      wrapDb: (db, i): Database =>
        i === 1
          ? db
          : {
              ...db,
              query: <Row>(text: string, params: readonly unknown[] = []) =>
                down ? db.query<Row>(terminated) : db.query<Row>(text, params),
            },
      // The provider's access tokens name the stack's resource (http://127.0.0.1:1) as their audience.
      // The client's backoff takes no time: a lost answer's retry comes at once.
      app: () => ({ baseUrl: gatewayPort.url, retryTiming: { sleep: async () => undefined } }),
    });
    resources = await startResourceStack({
      db: stack.dbs.one,
      gatewayPort,
      apiPort: 0,
      receiverPort: 0,
      baseUrl: 'http://127.0.0.1:1',
      authUrl: stack.authUrl,
      relay: false,
    });
  }, 120_000);

  afterAll(async () => {
    await resources?.close();
    if (!resources) await gatewayPort?.close();
    await stack?.close();
  });

  const charges = async (key: string) =>
    (
      await stack.dbs.one.query<{ count: number }>(
        'select count(*)::int as count from api_charges where idempotency_key = $1',
        [key],
      )
    ).rows[0]?.count;

  const post = (url: string, cookie: string, fields: Record<string, string>) =>
    fetch(url, {
      method: 'POST',
      headers: { cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams(fields),
      redirect: 'manual',
    });

  it('offers the same charge again with the same key when its answer was lost, and that replays the first charge', async () => {
    const { agent } = await stack.signIn();
    const home = await agent.request(new URL('/', stack.appUrls[0]).href);
    const cookie = agent.jar.header();
    const key = formField(home.body, 'key');
    const url = new URL('/charges', stack.appUrls[0]).href;

    downOnCharge = true;
    loseAnswer = true;
    let answer: Response;
    try {
      answer = await post(url, cookie, { csrf: formField(home.body, 'csrf'), key, amount: '1234', currency: 'EUR' });
    } finally {
      downOnCharge = false;
      loseAnswer = false;
      down = false;
    }
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    const page = await answer.text();
    expect(await charges(key)).toBe(1);
    expect(page).toContain('Outcome not known');
    expect(page).not.toContain('Nothing was done');
    // The key, said in words, and a form that sends the very same charge.
    expect(page).toContain(key);
    expect(page).toContain('action="/charges"');
    expect(formField(page, 'key')).toBe(key);
    expect(formField(page, 'amount')).toBe('1234');
    expect(formField(page, 'currency')).toBe('EUR');

    // Sent again once the database is back: the API's stored answer, not a second charge.
    const again = await post(url, cookie, {
      csrf: formField(page, 'csrf'),
      key: formField(page, 'key'),
      amount: formField(page, 'amount'),
      currency: formField(page, 'currency'),
    });
    expect(again.status).toBe(303);
    const shown = await agent.request(new URL(again.headers.get('location')!, stack.appUrls[0]).href);
    expect(shown.body).toContain('Charge created.');
    expect(shown.body).toContain(`Idempotency-Key: ${key}`);
    expect(shown.body).toContain('Replayed: yes');
    expect(await charges(key)).toBe(1);
  });

  /**
   * Sends a charge from the home page's form (under `key` if given: that form sent again), the app's
   * database failing from the gateway's answer on.
   */
  const chargeWithStoreDownAfterApi = async (
    amount: string,
    signedIn?: Awaited<ReturnType<TwoAppStack['signIn']>>,
    repeatKey?: string,
  ) => {
    const { agent } = signedIn ?? (await stack.signIn());
    const home = await agent.request(new URL('/', stack.appUrls[0]).href);
    const key = repeatKey ?? formField(home.body, 'key');
    downOnCharge = true;
    try {
      const answer = await post(new URL('/charges', stack.appUrls[0]).href, agent.jar.header(), {
        csrf: formField(home.body, 'csrf'),
        key,
        amount,
        currency: 'EUR',
      });
      return { key, answer, page: await answer.text() };
    } finally {
      downOnCharge = false;
      down = false;
    }
  };

  // Was wrong: a charge the API refused on sight (422: nothing ran) got the 503 "Outcome not known"
  // page, with the same charge offered again (refused again), although the outcome is known.
  it.each([
    ['an amount the app sends on (over the API limit)', String(maxChargeAmount + 1)],
    ['an amount the app does not take for a charge (negative)', '-5'],
  ])(
    'says nothing was charged when the API refused the charge, %s, and offers no same charge again',
    async (_what, amount) => {
      const { key, answer, page } = await chargeWithStoreDownAfterApi(amount);
      expect(answer.status).toBe(503);
      expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
      expect(await charges(key)).toBe(0);
      expect(page).toContain('Not charged');
      expect(page).toContain('nothing was charged');
      expect(page).toContain('422');
      expect(page).not.toContain('Outcome not known');
      expect(page).not.toContain('may have');
      expect(page).not.toContain('action="/charges"');
    },
  );

  // Was wrong: a charge the API answered 201 (created), the database failing after that, got the
  // "Outcome not known" page with the same charge offered again, although the outcome is known.
  it('says the charge was created when the API answered 2xx, and offers nothing to send again', async () => {
    const { key, answer, page } = await chargeWithStoreDownAfterApi('4321');
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(await charges(key)).toBe(1);
    expect(page).toContain('Charge created');
    expect(page).toContain('4321 EUR');
    expect(page).toContain(key);
    expect(page).toContain('no need to send');
    expect(page).not.toContain('Outcome not known');
    expect(page).not.toContain('may have');
    expect(page).not.toContain('action="/charges"');
  });

  // Was wrong: a kept form sent again with another amount, its key refused as standing for the first
  // charge (422 fingerprint_mismatch: nothing ran), the database failing after that, got the "Outcome
  // not known" page offering this very charge again under that key, which would be refused again.
  it('says the charge was not made when its key stands for an earlier charge, and offers no same key again', async () => {
    const signedIn = await stack.signIn();
    const home = await signedIn.agent.request(new URL('/', stack.appUrls[0]).href);
    const key = formField(home.body, 'key');
    const first = await post(new URL('/charges', stack.appUrls[0]).href, signedIn.agent.jar.header(), {
      csrf: formField(home.body, 'csrf'),
      key,
      amount: '100',
      currency: 'EUR',
    });
    expect(first.status).toBe(303);
    expect(await charges(key)).toBe(1);

    const { answer, page } = await chargeWithStoreDownAfterApi('200', signedIn, key);
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(await charges(key)).toBe(1);
    expect(page).toContain('Not charged');
    expect(page).toContain('stands for an earlier charge');
    expect(page).toContain('new charge');
    expect(page).not.toContain('Outcome not known');
    expect(page).not.toContain('may have');
    expect(page).not.toContain('action="/charges"');
    expect(page).not.toContain('Send the same charge again');
  });
});
