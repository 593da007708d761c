// The login throttle through the real login route, with clients on many IPv6 addresses (audit). The
// provider runs as `npm start` runs it behind one proxy (TRUST_PROXY=1): the client's address is the
// last one of X-Forwarded-For, the one the proxy appended, so each request here names the address it
// comes from there (a test cannot bind thousands of real IPv6 source addresses).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { openLoginForm } from './flow.js';
import { openTestDatabase } from './services.js';

let db: Database;
let running: RunningReferenceApp;

beforeAll(async () => {
  db = await openTestDatabase('login_throttle_ipv6');
  const before = process.env.TRUST_PROXY;
  process.env.TRUST_PROXY = '1';
  try {
    running = await startReferenceApp({
      db,
      authPort: 0,
      appPort: 0,
      baseUrl: 'http://localhost:8080',
      // One wrong password per name and /64, one per /64 across names; ten of each per /48.
      loginThrottle: { maxFailures: 1, maxFailuresPerAddress: 1 },
    });
  } finally {
    if (before === undefined) delete process.env.TRUST_PROXY;
    else process.env.TRUST_PROXY = before;
  }
}, 60_000);

afterAll(async () => {
  await running?.close();
  await db?.close();
});

describe('wrong passwords from many IPv6 addresses', () => {
  const guesser = async () => {
    const { agent, action, csrf } = await openLoginForm(running.authUrl, running.clients.app);
    return (username: string, from: string) =>
      agent.postForm(
        action,
        { csrf, username, password: 'not the password' },
        // The client's own entry first, then the proxy's: only the last counts.
        { 'x-forwarded-for': `198.51.100.1, ${from}` },
      );
  };

  it('counts every address of one /64 as one client', async () => {
    const guess = await guesser();
    expect((await guess('carol', '2001:db8:64:1::1')).response.status).toBe(200);
    const refused = await guess('carol', '2001:db8:64:1:aaaa:bbbb:cccc:dddd');
    expect(refused.response.status).toBe(429);
    expect(refused.body).toContain('Too many failed sign-ins');
    expect((await guess('carol', '2001:db8:64:2::1')).response.status).toBe(200);
  });

  // Was wrong: each /64 was a fresh count, and a /48 holds 65,536 of them.
  it('counts a /48 too, at ten times the /64 caps: a new /64 per guess is refused from the eleventh', async () => {
    const guess = await guesser();
    const statuses: number[] = [];
    for (let n = 1; n <= 11; n++)
      statuses.push((await guess('dave', `2001:db8:48:${n.toString(16)}::1`)).response.status);
    expect(statuses).toEqual([...Array(10).fill(200), 429]);
    // Another /48 is another client.
    expect((await guess('dave', '2001:db8:49:1::1')).response.status).toBe(200);
  });
});
