// A browser attacker's requests that need no browser: what the identity provider's pages promise
// (README, "What the identity provider enforces") checked at the HTTP level.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningReferenceApp } from '../src/start.js';
import { openLoginForm } from './flow.js';
import { bob, startTestIdp, type TestIdp } from './test-idp.js';

let started: TestIdp;
let running: RunningReferenceApp;

beforeAll(async () => {
  started = await startTestIdp('websec_audit');
  ({ running } = started);
}, 120_000);

afterAll(() => started?.close());

describe('password guessing at the login page, all at once', () => {
  // README: "after 10 wrong passwords for one name from one address within 15 minutes, that name and
  // address get 429 ... and no password is checked until the oldest failure is 15 minutes old". A
  // script does not wait for one answer before sending the next guess: one sign-in's form, posted
  // many times at once from one address.
  it('checks at most 10 passwords for one name and address, however many guesses arrive together', async () => {
    const { agent, action: loginUrl, csrf } = await openLoginForm(running.authUrl, running.clients.app);
    const guesses = 30;
    const answers = await Promise.all(
      Array.from({ length: guesses }, (_, guess) =>
        agent.postForm(loginUrl, { csrf, username: 'bob', password: `guess-${guess}` }),
      ),
    );
    const statuses = answers.map((answer) => answer.response.status);
    // 200 is the login page again, "Invalid username or password": a password was checked.
    expect(statuses.filter((status) => status === 200).length).toBeLessThanOrEqual(10);
    expect(statuses.filter((status) => status === 429).length).toBeGreaterThanOrEqual(guesses - 10);
    // And the right one is refused as well, until the wait is over.
    const right = await agent.postForm(loginUrl, {
      csrf,
      username: 'bob',
      password: bob.password,
    });
    expect(right.response.status).toBe(429);
  });
});
