// Audit (key rotation on a live system): the identity provider rotates its signing key while the
// guard has its JWKS cached and tokens of both keys are in flight, and the gateway rotates its
// internal-token key while the services verify. A real HTTP JWKS endpoint on an ephemeral port;
// time is injected and walked forward, never waited out.
//
// The identity provider's runbook (docs/operations.md, "Rotating secrets and keys"): publish the new
// key beside the old one, which keeps signing; once every guard can have seen it, sign with it; once
// the old key's last token has expired, remove it.
import { generateKeyPairSync } from 'node:crypto';
import { SignJWT } from 'jose';
import { describe, expect, it } from 'vitest';
import {
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  createGuard as guardFor,
  type Principal,
} from '../src/index.js';
import { type JwksReply, startJwksServer } from './support/jwks-server.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET, testKeys } from './support/tokens.js';

const keys = testKeys();
const GATEWAY = 'https://gateway.example';
// The identity provider's keys: `old` signs before the rotation, `next` after.
const publicJwk = (kid: string, pair: typeof keys.rsa) => ({ ...pair.publicJwk, kid, alg: 'RS256', use: 'sig' });
const oldKey = publicJwk('old', keys.rsa);
const nextKey = publicJwk('next', keys.rsa2);
// oidc-provider sends its JWKS without Cache-Control: the guard keeps it for defaultTtl (600 s).
const served = (...entries: object[]): JwksReply => ({ kind: 'json', body: { keys: entries } });

async function idpSetup() {
  const server = await startJwksServer(served(oldKey));
  const clock = manualClock();
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    cache: { maxEntries: 100 },
    issuers: [{ issuer: ISSUER, jwksUri: server.url, algorithms: ['RS256'] }],
  });
  // Access tokens live 5 minutes, as the reference app's do.
  const token = (kid: 'old' | 'next') =>
    makeToken({
      alg: 'RS256',
      key: kid === 'old' ? keys.rsa.privateKey : keys.rsa2.privateKey,
      header: { kid },
      now: clock.now(),
      claims: { jti: `${kid}-${clock.seconds()}` },
    });
  const code = async (token: string) => {
    const result = await guard.verify(token);
    return result.ok ? 'ok' : result.error.code;
  };
  return { server, clock, guard, token, code };
}

describe('the identity provider rotates its signing key', () => {
  it('staged (publish, then sign, then remove): no token of either key is refused while it lives; the removed key stops verifying once the cached set is refetched', async () => {
    const { server, clock, token, code } = await idpSetup();
    try {
      const oldToken = token('old');
      expect(await code(oldToken)).toBe('ok');
      // Step 1: the new key is published; the old one still signs.
      server.set(served(oldKey, nextKey));
      clock.advance(60);
      // Step 2, a cooldown (30 s) or more later: the new key signs. The guard's cached set is the one
      // of before step 1 (600 s life): the unknown kid makes it fetch again, at once.
      const nextToken = token('next');
      expect(await code(nextToken)).toBe('ok');
      expect(await code(oldToken)).toBe('ok');
      expect(server.requests).toBe(2);
      // Step 3, after the old key's last token expired (5 min): it is removed. Until the cached set
      // is refetched it verifies; a token minted with it now (a leaked key) stops at the refetch.
      clock.advance(301);
      server.set(served(nextKey));
      const late = token('old');
      expect(await code(late)).toBe('ok');
      clock.advance(600);
      expect(await code(token('next'))).toBe('ok');
      expect(await code(late)).toBe('key_unknown');
    } finally {
      await server.close();
    }
  });

  it('unstaged (the new key signs the moment it is published): its tokens are refused until the cooldown since the last fetch ends', async () => {
    const { server, clock, token, code } = await idpSetup();
    try {
      expect(await code(token('old'))).toBe('ok');
      clock.advance(10);
      server.set(served(nextKey, oldKey));
      // 10 s after the last fetch, within the 30 s cooldown: no fetch allowed, the kid is unknown.
      expect(await code(token('next'))).toBe('key_unknown');
      expect(server.requests).toBe(1);
      clock.advance(21);
      expect(await code(token('next'))).toBe('ok');
      expect(server.requests).toBe(2);
    } finally {
      await server.close();
    }
  });

  it('unstaged during a rolling restart of two provider replicas: a refetch answered by the replica not restarted yet leaves the new kid refused for negativeTtl after every replica serves it', async () => {
    const { server, clock, token, code } = await idpSetup();
    try {
      expect(await code(token('old'))).toBe('ok');
      clock.advance(31);
      // Replica A restarted with [next, old] and signs with next; the JWKS fetch reaches replica B.
      const fromA = token('next');
      expect(await code(fromA)).toBe('key_unknown');
      // Replica B restarts too: every replica now serves next. The guard remembers the miss.
      server.set(served(nextKey, oldKey));
      clock.advance(29);
      expect(await code(fromA)).toBe('key_unknown');
      clock.advance(2);
      expect(await code(fromA)).toBe('ok');
    } finally {
      await server.close();
    }
  });
});

async function edgePrincipal(): Promise<Principal> {
  const guard = guardFor({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, secret: SECRET }] });
  const result = await guard.verify(makeToken({ now: Date.now() }));
  if (!result.ok) throw new Error(result.error.code);
  return result.principal;
}

describe('the gateway rotates its internal-token key', () => {
  it('a service fetching the gateway JWKS over HTTP never refuses a token across rotate()', async () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now });
    const server = await startJwksServer({ kind: 'json', body: issuer.jwks() });
    try {
      const verifier = createInternalVerifier({
        issuer: GATEWAY,
        audience: 'orders',
        jwksUri: server.url,
        now: clock.now,
        cache: false,
      });
      const principal = await edgePrincipal();
      const refused: string[] = [];
      for (let t = 0; t <= 300; t += 10) {
        if (t === 20) issuer.rotate();
        server.set({ kind: 'json', body: issuer.jwks() });
        const result = await verifier.verify(await issuer.mint(principal, { audience: 'orders' }));
        if (!result.ok) refused.push(`t=${t}: ${result.error.code}`);
        clock.advance(10);
      }
      expect(refused).toEqual([]);
    } finally {
      await server.close();
    }
  });

  // Was wrong: createInternalVerifier's `jwks` option is documented for one process as
  // `jwks: issuer.jwks()`, and guard.md tells the gateway to call `rotate()` to roll its key. The
  // verifier took a copy of the set when it was built: once the new key signs (rotationDelay later),
  // every internal token is key_unknown (401) for as long as the process lives, and a key withdrawn
  // by rotate(key, { delay: 0 }) verifies for as long too. Fixed: `jwks` also takes a function,
  // read on every lookup, so `jwks: () => issuer.jwks()` follows rotations.
  it('a service in the same process, given () => issuer.jwks(), follows rotate(), and drops a withdrawn key', async () => {
    const clock = manualClock();
    const first = generateKeyPairSync('ed25519').privateKey;
    const issuer = createInternalTokenIssuer({
      issuer: GATEWAY,
      now: clock.now,
      keys: [{ kid: 'first', privateKey: first }],
    });
    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      jwks: () => issuer.jwks(),
      now: clock.now,
      cache: false,
    });
    const principal = await edgePrincipal();
    const code = async (token?: string) => {
      const result = await verifier.verify(token ?? (await issuer.mint(principal, { audience: 'orders' })));
      return result.ok ? 'ok' : result.error.code;
    };
    // A token as the gateway's key `first` signs one, minted whenever the test likes (a thief's).
    const byFirst = () =>
      new SignJWT({ scope: 'orders:read' })
        .setProtectedHeader({ alg: 'EdDSA', kid: 'first', typ: 'internal+jwt' })
        .setIssuer(GATEWAY)
        .setAudience('orders')
        .setSubject('user-1')
        .setIssuedAt(clock.seconds())
        .setExpirationTime(clock.seconds() + 60)
        .sign(first);
    expect(await code()).toBe('ok');
    issuer.rotate();
    expect(await code()).toBe('ok');
    clock.advance(61);
    // The new key signs now.
    expect(await code()).toBe('ok');
    expect(await code(await byFirst())).toBe('ok');
    // `first` is compromised after all: rotated out at once. Once its own tokens have expired it is
    // withdrawn, and what its thief signs stops verifying.
    issuer.rotate(undefined, { delay: 0 });
    expect(await code()).toBe('ok');
    clock.advance(60 + 61);
    expect(await code()).toBe('ok');
    expect(await code(await byFirst())).toBe('key_unknown');
  });

  it('a jwks function that throws, or returns a set that does not import, refuses with keys_unavailable (401, retryable), never a 500; a bad first set is a TypeError at construction', async () => {
    const clock = manualClock();
    const issuer = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now });
    let broken: 'no' | 'throws' | 'junk' = 'no';
    const verifier = createInternalVerifier({
      issuer: GATEWAY,
      audience: 'orders',
      jwks: () => {
        if (broken === 'throws') throw new Error('gone');
        return broken === 'junk' ? { keys: [{ kty: 'nope' }] } : issuer.jwks();
      },
      now: clock.now,
      cache: false,
    });
    const principal = await edgePrincipal();
    const token = await issuer.mint(principal, { audience: 'orders' });
    expect((await verifier.verify(token)).ok).toBe(true);
    for (const mode of ['throws', 'junk'] as const) {
      broken = mode;
      const result = await verifier.verify(token);
      expect(result.ok ? 'ok' : `${result.error.code} ${result.error.status}`).toBe('keys_unavailable 401');
    }
    broken = 'no';
    expect((await verifier.verify(token)).ok).toBe(true);
    expect(() =>
      createInternalVerifier({ issuer: GATEWAY, audience: 'orders', jwks: () => ({ keys: 'x' }) as never }),
    ).toThrow(TypeError);
  });
});
