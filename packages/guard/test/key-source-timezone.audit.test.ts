// Environment audit: the guard under a host time zone other than UTC. RFC 9110 5.6.7 says a recipient
// must accept all three HTTP-date forms; the asctime one carries no zone and always means GMT.
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createGuard } from '../src/index.js';
import { startJwksServer } from './support/jwks-server.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, START_MS, testKeys } from './support/tokens.js';

const keys = testKeys();
const days = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const monthNames = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

/** The asctime form of an HTTP-date (`Sun Nov  6 08:49:37 1994`), always in GMT. */
function asctime(ms: number): string {
  const d = new Date(ms);
  const two = (n: number) => String(n).padStart(2, '0');
  return (
    `${days[d.getUTCDay()]} ${monthNames[d.getUTCMonth()]} ${String(d.getUTCDate()).padStart(2, ' ')} ` +
    `${two(d.getUTCHours())}:${two(d.getUTCMinutes())}:${two(d.getUTCSeconds())} ${d.getUTCFullYear()}`
  );
}

let savedTz: string | undefined;
const servers: Array<{ close(): Promise<void> }> = [];
beforeEach(() => {
  savedTz = process.env.TZ;
});
afterEach(async () => {
  if (savedTz === undefined) delete process.env.TZ;
  else process.env.TZ = savedTz;
  await Promise.all(servers.splice(0).map((server) => server.close()));
});

/** Requests the JWKS endpoint got after a verify at 0 s and one at `laterSeconds`, on a host in `tz`. */
async function fetchesWithin(tz: string, laterSeconds: number): Promise<number> {
  process.env.TZ = tz;
  const server = await startJwksServer({
    kind: 'json',
    body: { keys: [{ ...keys.ec.publicJwk, kid: 'k1', alg: 'ES256', use: 'sig' }] },
    // Five minutes of freshness, said with a Date in IMF-fixdate and an Expires in asctime form.
    headers: { date: new Date(START_MS).toUTCString(), expires: asctime(START_MS + 300_000) },
  });
  servers.push(server);
  const clock = manualClock();
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    cache: false,
    issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256'] }],
  });
  const token = () => makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' }, now: clock.now() });
  expect((await guard.verify(token())).ok).toBe(true);
  clock.advance(laterSeconds);
  expect((await guard.verify(token())).ok).toBe(true);
  return server.requests;
}

describe('remote JWKS lifetime from an asctime Expires', () => {
  it('holds on a UTC host: the set is fetched again after its five minutes', async () => {
    expect(await fetchesWithin('UTC', 301)).toBe(2);
  });

  // Was a defect: parseCacheLifetime (packages/guard/src/key-source.ts) reads Expires and Date with
  // Date.parse, which takes the zone-less asctime form as the host's local time. On a host in
  // America/St_Johns (UTC-3:30) a JWKS the IdP made fresh for five minutes is kept 3 h 35 min, so a
  // key the IdP retired or revoked keeps verifying tokens for hours; in Pacific/Kiritimati (UTC+14) it
  // is stale at once and refetched on every unknown kid. Fix: parse HTTP-dates with an explicit
  // grammar (the client's parseHttpDate in packages/client/src/retry-after.ts already does).
  it('on a host in America/St_Johns, the same set is fetched again after its five minutes too', async () => {
    expect(await fetchesWithin('America/St_Johns', 301)).toBe(2);
  });
});
