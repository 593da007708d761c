import { createHash } from 'node:crypto';
import { calculateJwkThumbprint } from 'jose';
import { describe, expect, it } from 'vitest';
import { createGuard } from '../src/index.js';
import {
  AUDIENCE,
  b64url,
  ISSUER,
  makeToken,
  manualClock,
  proofClaims,
  SECRET,
  signSegments,
  testKeys,
} from './support/tokens.js';

// RFC 9449 §4.3's checks of a proof, each pinned where dpop.test.ts left a form of it open: what a
// resource server must refuse, and the spellings it must still take.

const keys = testKeys();
const ORIGIN = 'https://api.example';

type Edit = {
  header?: Record<string, unknown>;
  claims?: Record<string, unknown> | ((made: { accessToken: string; now: number }) => Record<string, unknown>);
};

async function attempt(edit: Edit, url = '/orders') {
  const clock = manualClock();
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    dpop: { origin: ORIGIN },
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
  const pair = keys.rsa;
  const accessToken = makeToken({
    claims: { cnf: { jkt: await calculateJwkThumbprint(pair.publicJwk as never, 'sha256') } },
  });
  const header = { typ: 'dpop+jwt', alg: 'PS256', jwk: pair.publicJwk, ...edit.header };
  const claims = {
    ...proofClaims(accessToken, `${ORIGIN}/orders`, clock.seconds()),
    ...(typeof edit.claims === 'function' ? edit.claims({ accessToken, now: clock.seconds() }) : edit.claims),
  };
  const dpop = signSegments(b64url(header), b64url(claims), String(header.alg), pair.privateKey);
  const result = await guard.authenticate({
    method: 'POST',
    url,
    headers: { authorization: `DPoP ${accessToken}`, dpop },
  });
  return result.ok ? 'ok' : result.error.code;
}

describe('DPoP proof checks (RFC 9449 §4.3)', () => {
  it('takes the spellings the RFCs make equal', async () => {
    // typ is a media type: case-insensitive, `application/` optional (RFC 7515 §4.1.9).
    expect(await attempt({ header: { typ: 'application/dpop+jwt' } })).toBe('ok');
    expect(await attempt({ header: { typ: 'DPoP+JWT' } })).toBe('ok');
    // htu: query and fragment ignored on both sides.
    expect(await attempt({ claims: { htu: `${ORIGIN}/orders?page=1#top` } }, '/orders?page=2')).toBe('ok');
  });

  it('refuses what a proof for this request cannot be', async () => {
    const refused: Array<[string, Edit]> = [
      // Methods are case-sensitive (RFC 9110 §9.1).
      ['htm in lower case', { claims: { htm: 'post' } }],
      ['htm missing', { claims: { htm: undefined } }],
      ['htu missing', { claims: { htu: undefined } }],
      ['htu relative', { claims: { htu: '/orders' } }],
      ['htu of another scheme', { claims: { htu: 'http://api.example/orders' } }],
      ['htu of another port', { claims: { htu: 'https://api.example:8443/orders' } }],
      ['ath missing', { claims: { ath: undefined } }],
      [
        'ath padded',
        { claims: ({ accessToken }) => ({ ath: `${createHash('sha256').update(accessToken).digest('base64url')}=` }) },
      ],
      [
        'ath in base64, not base64url',
        { claims: ({ accessToken }) => ({ ath: createHash('sha256').update(accessToken).digest('base64') }) },
      ],
      ['iat missing', { claims: { iat: undefined } }],
      ['iat as a string', { claims: ({ now }) => ({ iat: String(now) }) }],
      ['typ missing', { header: { typ: undefined } }],
      ['typ jwt', { header: { typ: 'JWT' } }],
      ['alg none', { header: { alg: 'none' } }],
      ['jti a number', { claims: { jti: 42 } }],
      // RFC 9449 §4.2: the jwk must not hold a private key; RSA's private members too.
      ['RSA private member p', { header: { jwk: { ...keys.rsa.publicJwk, p: 'AQAB' } } }],
      ['RSA private member qi', { header: { jwk: { ...keys.rsa.publicJwk, qi: 'AQAB' } } }],
    ];
    for (const [label, edit] of refused) expect(await attempt(edit), label).toBe('dpop_proof_invalid');
  });

  // Was wrong: an `htu` with user information (`https://user:pw@api.example/orders`) matched the
  // request, the WHATWG origin dropping it. RFC 9110 §4.2.4: an http(s) URI in a message must not
  // carry userinfo and a recipient should treat it as an error; no client's request URI has it, so
  // such a proof was not made for this request.
  it('refuses an htu with user information', async () => {
    expect(await attempt({ claims: { htu: 'https://user:pw@api.example/orders' } })).toBe('dpop_proof_invalid');
    expect(await attempt({ claims: { htu: 'https://user@api.example/orders' } })).toBe('dpop_proof_invalid');
  });
});
