import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
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
