import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { demoUsers } from '../src/seed.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { openLoginForm } from './flow.js';
import { openTestDatabase } from './services.js';

// Mutation pass: the login page refuses while the throttle says to wait at all, its last second
// included (`wait > 0`). The throttle's clock is injected, so the test stands at that last second.
let db: Database;
let running: RunningReferenceApp;
let clock = Date.UTC(2026, 0, 1);

beforeAll(async () => {
  db = await openTestDatabase('login_throttle_wait');
  running = await startReferenceApp({
    db,
    authPort: 0,
    appPort: 0,
    baseUrl: 'http://localhost:8080',
    loginThrottle: { maxFailures: 1, windowMs: 60_000, now: () => clock },
  });
}, 60_000);

afterAll(async () => {
  await running?.close();
  await db?.close();
});

describe('the login page under the throttle', () => {
  it('refuses a sign-in in the last second of the wait with 429 Retry-After: 1, and takes it once the wait is over', async () => {
    const { agent, action: loginUrl, csrf } = await openLoginForm(running.authUrl, running.clients.app);
    const guess = () => agent.postForm(loginUrl, { csrf, username: 'bob', password: 'not-bobs-password' });
    expect((await guess()).response.status).toBe(200);
    clock += 59_001;
    const refused = await guess();
    expect(refused.response.status).toBe(429);
    expect(refused.response.headers.get('retry-after')).toBe('1');
    clock += 999;
    expect((await guess()).response.status).toBe(200);
  });
});

// Was wrong: the throttle counted per name and address only, so one address sprayed one password over
// as many names as it liked and was never refused. The per-address cap answers as the pair's does.
describe('the login page under the per-address cap', () => {
  let sprayed: RunningReferenceApp;

  beforeAll(async () => {
    sprayed = await startReferenceApp({
      db,
      authPort: 0,
      appPort: 0,
      baseUrl: 'http://localhost:8080',
      loginThrottle: { maxFailures: 3, maxFailuresPerAddress: 4, windowMs: 60_000, now: () => clock },
    });
  }, 60_000);

  afterAll(async () => {
    await sprayed?.close();
  });

  it('refuses every name from an address past its cap with 429 and Retry-After, a right password too', async () => {
    const { agent, action: loginUrl, csrf } = await openLoginForm(sprayed.authUrl, sprayed.clients.app);
    const guess = (username: string, password = 'Winter2026!') =>
      agent.postForm(loginUrl, { csrf, username, password });
    for (const name of ['carol', 'dave', 'erin', 'frank']) expect((await guess(name)).response.status).toBe(200);
    const refused = await guess('grace');
    expect(refused.response.status).toBe(429);
    expect(refused.response.headers.get('retry-after')).toBe('60');
    expect(refused.body).toContain('Too many');
    expect((await guess('alice', demoUsers[0].password)).response.status).toBe(429);
  });
});
