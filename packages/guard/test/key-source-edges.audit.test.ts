import { afterEach, describe, expect, it } from 'vitest';
import { createGuard, type GuardOptions, principalFromClaims } from '../src/index.js';
import { type JwksReply, startJwksServer } from './support/jwks-server.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, START_MS, testKeys } from './support/tokens.js';

// Mutation pass over the key sources and principal mapping: edges that no other test pinned down.
// A real JWKS server on loopback; time is injected.

const keys = testKeys();
const jwk = (kid: string) => ({ ...keys.ec.publicJwk, kid, alg: 'ES256', use: 'sig' });
const k1For = (seconds: number): JwksReply => ({
  kind: 'json',
  body: { keys: [jwk('k1')] },
  headers: { 'cache-control': `max-age=${seconds}` },
});

let servers: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(servers.map((server) => server.close()));
  servers = [];
});

async function setup(reply: JwksReply, jwksOptions: NonNullable<GuardOptions['issuers'][number]['jwksOptions']>) {
  const server = await startJwksServer(reply);
  servers.push(server);
  const clock = manualClock();
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    cache: false,
    issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['ES256'], jwksOptions }],
  });
  // Valid for the two hours these tests walk through.
  const token = (kid: string) =>
    makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid }, claims: { exp: START_MS / 1000 + 7200 } });
  return { server, clock, guard, token };
}

describe('remote JWKS edges', () => {
  it('remembers at most maxUnknownKids kids: the oldest is forgotten when the bound is reached', async () => {
    const { server, guard, token } = await setup(k1For(3600), { cooldown: 0, negativeTtl: 600, maxUnknownKids: 2 });
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    // Three unknown kids at once share one fetch, then each is remembered: with room for two, the
    // first is forgotten. (A fetch that succeeds forgets them all, so only callers of one fetch fill it.)
    await Promise.all(['ghost-a', 'ghost-b', 'ghost-c'].map((kid) => guard.verify(token(kid))));
    expect(server.requests).toBe(2);
    await guard.verify(token('ghost-a'));
    expect(server.requests).toBe(3);
  });

  it('stale-if-error ends exactly staleIfError after the set expired', async () => {
    const { server, clock, guard, token } = await setup(k1For(60), { cooldown: 30, staleIfError: 100 });
    expect((await guard.verify(token('k1'))).ok).toBe(true); // t=0, expires at t=60
    server.set({ kind: 'raw', status: 503, body: 'down' });
    clock.advance(61);
    expect((await guard.verify(token('k1'))).ok).toBe(true); // stale, the refresh failed
    clock.advance(98); // t=159: still within stale-if-error
    expect((await guard.verify(token('k1'))).ok).toBe(true);
    clock.advance(1); // t=160 = 60 + 100: over
    const refused = await guard.verify(token('k1'));
    expect(refused.ok).toBe(false);
    expect(refused.ok ? undefined : refused.error.code).toBe('keys_unavailable');
  });

  it('maxBytes is the largest response accepted, with or without a Content-Length', async () => {
    const body = JSON.stringify({ keys: [jwk('k1')] });
    const size = Buffer.byteLength(body);
    const raw = (headers: Record<string, string>): JwksReply => ({ kind: 'raw', status: 200, body, headers });
    const framings: Record<string, string>[] = [{ 'content-length': String(size) }, { 'transfer-encoding': 'chunked' }];
    for (const headers of framings) {
      const exact = await setup(raw(headers), { maxBytes: size });
      expect((await exact.guard.verify(exact.token('k1'))).ok).toBe(true);
      const under = await setup(raw(headers), { maxBytes: size - 1 });
      expect((await under.guard.verify(under.token('k1'))).ok).toBe(false);
    }
  });

  it('takes http: for every loopback host, [::1] included, and refuses it elsewhere', () => {
    const guardFor = (jwksUri: string) => () =>
      createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, jwksUri, algorithms: ['ES256'] }] });
    expect(guardFor('http://[::1]:8080/jwks')).not.toThrow();
    expect(guardFor('http://localhost:8080/jwks')).not.toThrow();
    expect(guardFor('http://[::2]:8080/jwks')).toThrow(TypeError);
  });
});

describe('a jwks function (live key source)', () => {
  it('drops the verified-token cache only when the set changed, not on every lookup', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: () => START_MS,
      cache: { maxEntries: 10 },
      issuers: [{ issuer: ISSUER, jwks: () => ({ keys: [jwk('k1')] }), algorithms: ['ES256'] }],
    });
    const token = (jti: string) =>
      makeToken({ alg: 'ES256', key: keys.ec.privateKey, header: { kid: 'k1' }, claims: { jti } });
    const first = token('a');
    expect((await guard.verify(first)).ok).toBe(true);
    expect((await guard.verify(token('b'))).ok).toBe(true); // a lookup of the same, unchanged set
    expect((await guard.verify(first)).ok).toBe(true);
    expect(guard.stats().cacheHits).toBe(1);
  });
});

describe('principal mapping', () => {
  it('takes no empty role, from a string or an array', () => {
    expect([...principalFromClaims({ sub: 'u', roles: '' }).roles]).toEqual([]);
    expect([...principalFromClaims({ sub: 'u', roles: ['', 'clerk'] }).roles]).toEqual(['clerk']);
    expect([...principalFromClaims({ sub: 'u', scp: ['', 'orders:read'] }).scope]).toEqual(['orders:read']);
  });

  it('a roles claim path walks plain objects only, never into an array by index', () => {
    const claims = { sub: 'u', groups: ['admin'], realm_access: { roles: ['clerk'] } };
    expect([...principalFromClaims(claims, { rolesClaim: ['groups', '0'] }).roles]).toEqual([]);
    expect([...principalFromClaims(claims, { rolesClaim: ['realm_access', 'roles'] }).roles]).toEqual(['clerk']);
  });
});
