import { createHash, randomUUID } from 'node:crypto';
import { calculateJwkThumbprint } from 'jose';
import { describe, expect, it } from 'vitest';
import { createDpopNonces } from '../src/dpop.js';
import { createGuard, type GuardResult } from '../src/index.js';
import { AUDIENCE, b64url, ISSUER, makeToken, SECRET, signSegments, testKeys } from './support/tokens.js';

// Audit (clocks): DPoP server nonces (RFC 9449 §9) shared by several gateways through one `secret`
// (docs/guard.md: "Several gateways take each other's nonces when they share `secret`"), with the
// gateways' clocks a second apart, well inside the guard's default clockTolerance of 5 s.

const keys = testKeys();
const ORIGIN = 'https://api.example';
const LIFETIME_S = 300;
// A nonce window boundary: the time divided by the lifetime is a whole number here.
const BOUNDARY_MS = Math.ceil(1_800_000_000_000 / (LIFETIME_S * 1000)) * LIFETIME_S * 1000;
const secret = 'a shared secret of thirty-two bytes!';

function gateway(nowMs: number) {
  return createGuard({
    audience: AUDIENCE,
    now: () => nowMs,
    dpop: { origin: ORIGIN, nonce: { secret, lifetime: LIFETIME_S } },
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
}

function proof(accessToken: string, nowSeconds: number, claims: Record<string, unknown> = {}): string {
  const header = { typ: 'dpop+jwt', alg: 'ES256', jwk: keys.ec.publicJwk };
  const payload = {
    jti: randomUUID(),
    htm: 'POST',
    htu: `${ORIGIN}/orders`,
    iat: nowSeconds,
    ath: createHash('sha256').update(accessToken).digest('base64url'),
    ...claims,
  };
  return signSegments(b64url(header), b64url(payload), 'ES256', keys.ec.privateKey);
}

const code = (result: GuardResult) => (result.ok ? 'ok' : result.error.code);

describe('DPoP nonces across gateways whose clocks are 1 s apart', () => {
  // Was a defect: a nonce is taken only for the checker's current window or the one before (dpop.ts, createDpopNonces check: `window !== now && window !== now - 1`), with no clock tolerance, so for the first second of every window (the skew) a nonce handed out by the faster gateway is refused by the slower one with 401 use_dpop_nonce.
  it("the slower gateway takes the faster one's fresh nonce", async () => {
    const fast = gateway(BOUNDARY_MS + 500); // already in the new window
    const slow = gateway(BOUNDARY_MS - 500); // 1 s behind: still in the old one
    const clientSeconds = Math.floor((BOUNDARY_MS + 500) / 1000);
    const jkt = await calculateJwkThumbprint(keys.ec.publicJwk as never, 'sha256');
    const accessToken = makeToken({ now: BOUNDARY_MS - 60_000, claims: { cnf: { jkt }, exp: clientSeconds + 3600 } });
    const send = (guard: ReturnType<typeof gateway>, claims: Record<string, unknown> = {}) =>
      guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: proof(accessToken, clientSeconds, claims) },
      });

    const first = await send(fast);
    expect(code(first)).toBe('dpop_nonce_required');
    const nonce = first.ok ? undefined : first.error.dpopNonce;
    expect(nonce).toBeDefined();
    // The same client's next request is load-balanced to the other gateway.
    expect(code(await send(slow, { nonce }))).toBe('ok');
  });
});

describe('createDpopNonces: how far ahead a nonce may come from', () => {
  const nonces = createDpopNonces(Buffer.from(secret), LIFETIME_S * 1000);
  const next = nonces.current(BOUNDARY_MS);

  it('a nonce of the next window is current within the tolerance of its start, and refused before', () => {
    expect(nonces.check(next, BOUNDARY_MS - 5_000, 5_000)).toBe('current');
    expect(nonces.check(next, BOUNDARY_MS - 5_001, 5_000)).toBe('invalid');
    expect(nonces.check(next, BOUNDARY_MS - 1, 0)).toBe('invalid');
    expect(nonces.check(next, BOUNDARY_MS - 1)).toBe('invalid');
  });

  it('two windows ahead is never taken, whatever the tolerance', () => {
    const twoAhead = nonces.current(BOUNDARY_MS + LIFETIME_S * 1000);
    expect(nonces.check(twoAhead, BOUNDARY_MS - 1, 60_000)).toBe('invalid');
  });
});
