import { createHash, randomUUID } from 'node:crypto';
import { calculateJwkThumbprint } from 'jose';
import { describe, expect, it } from 'vitest';
import { createGuard, type DpopOptions, type GuardResult } from '../src/index.js';
import { AUDIENCE, b64url, ISSUER, makeToken, manualClock, SECRET, signSegments, testKeys } from './support/tokens.js';

// Research case 52 and section 10 item 9: DPoP (RFC 9449) with a replay memory and dual challenges.

const keys = testKeys();
const ORIGIN = 'https://api.example';

function setup(dpop: DpopOptions = {}) {
  const clock = manualClock();
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    dpop: { origin: ORIGIN, ...dpop },
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
  return { clock, guard };
}

const jkt = (jwk: Record<string, unknown>) => calculateJwkThumbprint(jwk as never, 'sha256');

interface ProofSpec {
  accessToken: string;
  htm?: string;
  htu?: string;
  iat?: number;
  jti?: string;
  header?: Record<string, unknown>;
  claims?: Record<string, unknown>;
  key?: typeof keys.ec;
  alg?: string;
}

function proof(spec: ProofSpec, nowSeconds: number): string {
  const pair = spec.key ?? keys.ec;
  const alg = spec.alg ?? 'ES256';
  const header = { typ: 'dpop+jwt', alg, jwk: pair.publicJwk, ...spec.header };
  const claims = {
    jti: spec.jti ?? randomUUID(),
    htm: spec.htm ?? 'POST',
    htu: spec.htu ?? `${ORIGIN}/orders`,
    iat: spec.iat ?? nowSeconds,
    ath: createHash('sha256').update(spec.accessToken).digest('base64url'),
    ...spec.claims,
  };
  return signSegments(b64url(header), b64url(claims), alg, pair.privateKey);
}

function code(result: GuardResult): string {
  return result.ok ? 'ok' : result.error.code;
}

describe('DPoP (case 52)', () => {
  it('accepts a bound token with a valid proof, then refuses the same proof again (replay)', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const dpopProof = proof({ accessToken }, clock.seconds());
    const request = {
      method: 'POST',
      url: '/orders?page=2',
      headers: { authorization: `DPoP ${accessToken}`, dpop: dpopProof, host: 'internal:8080' },
    };
    const first = await guard.authenticate(request);
    expect(code(first)).toBe('ok');
    const replay = await guard.authenticate(request);
    expect(code(replay)).toBe('dpop_proof_replayed');
    if (!replay.ok) {
      expect(replay.error.status).toBe(401);
      expect(replay.error.wwwAuthenticate).toBe(
        'DPoP realm="api", error="invalid_dpop_proof", error_description="The DPoP proof was already used", algs="ES256 EdDSA PS256 RS256"',
      );
    }
    // A fresh proof for the same token passes (the verified-token cache keys on token and key).
    const again = await guard.authenticate({
      ...request,
      headers: { ...request.headers, dpop: proof({ accessToken }, clock.seconds()) },
    });
    expect(code(again)).toBe('ok');
  });

  it('refuses htm, htu, ath, iat, typ, alg, key and signature mismatches', async () => {
    const { clock, guard } = setup({ maxAge: 60 });
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const now = clock.seconds();
    const bad: Array<[string, string]> = [
      ['htm', proof({ accessToken, htm: 'GET' }, now)],
      ['htu path', proof({ accessToken, htu: `${ORIGIN}/refunds` }, now)],
      ['htu host', proof({ accessToken, htu: 'https://evil.example/orders' }, now)],
      ['ath', proof({ accessToken: 'another-token' }, now)],
      ['iat too old', proof({ accessToken, iat: now - 120 }, now)],
      ['iat in the future', proof({ accessToken, iat: now + 120 }, now)],
      ['typ', proof({ accessToken, header: { typ: 'jwt' } }, now)],
      ['private key in jwk', proof({ accessToken, header: { jwk: { ...keys.ec.publicJwk, d: 'AAAA' } } }, now)],
      ['foreign signature', proof({ accessToken, header: { jwk: keys.ed.publicJwk } }, now)],
      ['no jwk', proof({ accessToken, header: { jwk: undefined } }, now)],
      ['jti missing', proof({ accessToken, claims: { jti: undefined } }, now)],
    ];
    for (const [label, dpopProof] of bad) {
      const result = await guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop: dpopProof },
      });
      expect(code(result), label).toBe('dpop_proof_invalid');
    }
    const hmacProof = signSegments(
      b64url({ typ: 'dpop+jwt', alg: 'HS256', jwk: { kty: 'oct', k: 'x'.repeat(43) } }),
      b64url({ jti: 'j', htm: 'POST', htu: `${ORIGIN}/orders`, iat: now }),
      'HS256',
      'x'.repeat(32),
    );
    const hmac = await guard.authenticate({
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${accessToken}`, dpop: hmacProof },
    });
    expect(code(hmac)).toBe('dpop_proof_invalid');
  });

  it('refuses a missing or doubled proof header, and a token bound to another key', async () => {
    const { clock, guard } = setup();
    const accessToken = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    const base = { method: 'POST', url: '/orders' };
    expect(code(await guard.authenticate({ ...base, headers: { authorization: `DPoP ${accessToken}` } }))).toBe(
      'dpop_proof_invalid',
    );
    const twice = [proof({ accessToken }, clock.seconds()), proof({ accessToken }, clock.seconds())];
    expect(
      code(await guard.authenticate({ ...base, headers: { authorization: `DPoP ${accessToken}`, dpop: twice } })),
    ).toBe('dpop_proof_invalid');
    const otherKeyProof = proof({ accessToken, key: keys.ed, alg: 'EdDSA' }, clock.seconds());
    const mismatch = await guard.authenticate({
      ...base,
      headers: { authorization: `DPoP ${accessToken}`, dpop: otherKeyProof },
    });
    expect(code(mismatch)).toBe('token_binding_invalid');
    if (!mismatch.ok)
      expect(mismatch.error.wwwAuthenticate.startsWith('DPoP realm="api", error="invalid_token"')).toBe(true);
    const unbound = makeToken();
    const unboundResult = await guard.authenticate({
      ...base,
      headers: { authorization: `DPoP ${unbound}`, dpop: proof({ accessToken: unbound }, clock.seconds()) },
    });
    expect(code(unboundResult)).toBe('token_binding_invalid');
  });

  it('a DPoP-bound token sent as Bearer is refused; plain bearer tokens still work when DPoP is optional', async () => {
    const { guard } = setup();
    const bound = makeToken({ claims: { cnf: { jkt: await jkt(keys.ec.publicJwk) } } });
    expect(code(await guard.authenticate({ headers: { authorization: `Bearer ${bound}` } }))).toBe('token_bound');
    expect(code(await guard.authenticate({ headers: { authorization: `Bearer ${makeToken()}` } }))).toBe('ok');
    const missing = await guard.authenticate({ headers: {} });
    expect(!missing.ok && missing.error.wwwAuthenticate).toBe(
      'Bearer realm="api", DPoP realm="api", algs="ES256 EdDSA PS256 RS256"',
    );
  });

  it('required mode refuses Bearer and challenges with DPoP only', async () => {
    const { guard } = setup({ required: true, algorithms: ['ES256'] });
    const result = await guard.authenticate({ headers: { authorization: `Bearer ${makeToken()}` } });
    expect(code(result)).toBe('token_missing');
    if (!result.ok) expect(result.error.wwwAuthenticate).toBe('DPoP realm="api", algs="ES256"');
  });

  it('uses a shared replay store when given one', async () => {
    const seen = new Set<string>();
    const keysSeen: string[] = [];
    const { clock, guard } = setup({
      replay: (key) => {
        keysSeen.push(key);
        if (seen.has(key)) return false;
        seen.add(key);
        return true;
      },
    });
    const thumbprint = await jkt(keys.ec.publicJwk);
    const accessToken = makeToken({ claims: { cnf: { jkt: thumbprint } } });
    const dpopProof = proof({ accessToken, jti: 'proof-1' }, clock.seconds());
    const request = {
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${accessToken}`, dpop: dpopProof },
    };
    expect(code(await guard.authenticate(request))).toBe('ok');
    expect(code(await guard.authenticate(request))).toBe('dpop_proof_replayed');
    expect(keysSeen).toEqual([`${thumbprint}:proof-1`, `${thumbprint}:proof-1`]);
  });

  it('refuses bad DPoP options at construction', () => {
    expect(() => setup({ algorithms: ['HS256'] })).toThrow(TypeError);
    expect(() => setup({ maxAge: 0 })).toThrow(TypeError);
  });
});
