// Audit of guard.refreshKeys() (the operator's answer to a compromised key) at its edges: a JWKS
// read from a function on every lookup, a fetch that hangs to its timeout, a set served stale while
// the endpoint fails, a cache turned off, and an unknown-kid fetch racing it. Real HTTP server on an
// ephemeral port; the guard's clock is injected.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createGuard, type GuardEvent } from '../src/index.js';
import { type JwksReply, startJwksServer } from './support/jwks-server.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, testKeys } from './support/tokens.js';

const keys = testKeys();
const jwk = (kid: string, pair = keys.ec) => ({ ...pair.publicJwk, kid, alg: 'ES256', use: 'sig' });
const hourLong = (...entries: object[]): JwksReply => ({
  kind: 'json',
  body: { keys: entries },
  headers: { 'cache-control': 'max-age=3600' },
});

let servers: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(servers.map((server) => server.close()));
  servers = [];
});

const codeOf = (result: { ok: true } | { ok: false; error: { code: string } }) =>
  result.ok ? 'ok' : result.error.code;

describe('guard.refreshKeys() at its edges', () => {
  // Was wrong: for an issuer whose keys come from a `jwks` function (read on every lookup, as
  // docs/operations.md asks for the gateway's internal tokens in the same process), refreshKeys()
  // answered `configured` and did nothing: a token verified before the key was withdrawn from the
  // function's set stayed in the verified-token cache and kept passing (a hit never reads the set)
  // until its `exp`. The function is read again now, and the tokens cached under a withdrawn key go.
  it('a jwks function: the set is read again now, and tokens cached under a withdrawn key are refused', async () => {
    const clock = manualClock();
    let current: { keys: object[] } = { keys: [jwk('k1'), jwk('k2', keys.ec2)] };
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      cache: { maxEntries: 100 },
      issuers: [{ issuer: ISSUER, jwks: () => current, algorithms: ['ES256'] }],
    });
    const stolen = makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' }, now: clock.now() });
    expect(codeOf(await guard.verify(stolen))).toBe('ok');
    current = { keys: [jwk('k2', keys.ec2)] };
    expect(await guard.refreshKeys()).toEqual([{ issuer: ISSUER, outcome: 'configured' }]);
    expect(codeOf(await guard.verify(stolen))).toBe('key_unknown');
    const fine = makeToken({ alg: 'ES256', key: keys.ec2.privateKey, header: { kid: 'k2' }, now: clock.now() });
    expect(codeOf(await guard.verify(fine))).toBe('ok');
  });

  it('with the token cache off, a withdrawn key is refused after the refresh all the same', async () => {
    const server = await startJwksServer(hourLong(jwk('k1'), jwk('k2', keys.ec2)));
    servers.push(server);
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      cache: false,
      issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256'] }],
    });
    const stolen = makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' }, now: clock.now() });
    expect(codeOf(await guard.verify(stolen))).toBe('ok');
    server.set(hourLong(jwk('k2', keys.ec2)));
    expect(await guard.refreshKeys()).toEqual([{ issuer: ISSUER, outcome: 'fetched' }]);
    expect(codeOf(await guard.verify(stolen))).toBe('key_unknown');
  });

  it('an endpoint that hangs: refreshKeys ends with the fetch timeout as failed, the keys held stay', async () => {
    let open = () => {};
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    const server = await startJwksServer(hourLong(jwk('k1')));
    servers.push(server);
    const clock = manualClock();
    const events: GuardEvent[] = [];
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      onEvent: (event) => events.push(event),
      // A real timer, which bounds the first fetch (the keys held) too: 0.3 s was a race a loaded
      // box could lose. One second is waited once, by the hanging refresh.
      issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256'], jwksOptions: { timeout: 1 } }],
    });
    const token = makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' }, now: clock.now() });
    expect(codeOf(await guard.verify(token))).toBe('ok');
    server.set({ kind: 'gated', gate, reply: hourLong(jwk('k1')) });
    try {
      expect(await guard.refreshKeys()).toEqual([{ issuer: ISSUER, outcome: 'failed' }]);
      expect(events.filter((event) => event.type === 'jwks-fetch').at(-1)).toMatchObject({
        ok: false,
        reason: 'timeout',
      });
      expect(codeOf(await guard.verify(token))).toBe('ok');
    } finally {
      open();
    }
  });

  it('served stale while the endpoint fails: a refresh once it is back takes the new set, past the cooldown', async () => {
    const server = await startJwksServer({
      kind: 'json',
      body: { keys: [jwk('k1')] },
      headers: { 'cache-control': 'max-age=60' },
    });
    servers.push(server);
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      cache: { maxEntries: 100 },
      issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256'] }],
    });
    const stolen = makeToken({
      alg: 'ES256',
      key: keys.ec.privateKey,
      header: { kid: 'k1' },
      now: clock.now(),
      claims: { exp: Math.floor(clock.now() / 1000) + 3600 },
    });
    expect(codeOf(await guard.verify(stolen))).toBe('ok');
    server.set({ kind: 'raw', status: 503, body: '{}' });
    clock.advance(61);
    // Past its lifetime, the endpoint failing: the last good keys answer (stale-if-error).
    expect(codeOf(await guard.verify(stolen))).toBe('ok');
    await vi.waitFor(() => expect(server.requests).toBe(2));
    server.set(hourLong(jwk('k2', keys.ec2)));
    expect(await guard.refreshKeys()).toEqual([{ issuer: ISSUER, outcome: 'fetched' }]);
    expect(codeOf(await guard.verify(stolen))).toBe('key_unknown');
  });

  it('racing an unknown-kid fetch already on its way: the refresh sends its own request after it', async () => {
    let open = () => {};
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    const server = await startJwksServer(hourLong(jwk('k1')));
    servers.push(server);
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      cache: { maxEntries: 100 },
      issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256'] }],
    });
    const stolen = makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' }, now: clock.now() });
    expect(codeOf(await guard.verify(stolen))).toBe('ok');
    clock.advance(31); // past the cooldown: an unknown kid may fetch
    // The kid fetch leaves with the old set (k1 and k2) as its answer, held at the server.
    server.set({ kind: 'gated', gate, reply: hourLong(jwk('k1'), jwk('k2', keys.ec2)) });
    const newKid = guard.verify(
      makeToken({ alg: 'ES256', key: keys.ec2.privateKey, header: { kid: 'k2' }, now: clock.now() }),
    );
    await vi.waitFor(() => expect(server.requests).toBe(2));
    const refreshed = guard.refreshKeys();
    // k1 is withdrawn while that fetch is on its way.
    server.set(hourLong(jwk('k2', keys.ec2)));
    open();
    expect(codeOf(await newKid)).toBe('ok');
    expect(await refreshed).toEqual([{ issuer: ISSUER, outcome: 'fetched' }]);
    expect(server.requests).toBe(3);
    expect(codeOf(await guard.verify(stolen))).toBe('key_unknown');
  });
});
