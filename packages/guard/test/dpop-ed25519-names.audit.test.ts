import { calculateJwkThumbprint } from 'jose';
import { describe, expect, it } from 'vitest';
import { createGuard, type GuardResult } from '../src/index.js';
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

const keys = testKeys();
const ORIGIN = 'https://api.example';

const code = (result: GuardResult): string => (result.ok ? 'ok' : result.error.code);

describe('DPoP proofs and the two names of Ed25519', () => {
  const attempt = async (
    headerAlg: 'EdDSA' | 'Ed25519',
    jwkAlg: 'EdDSA' | 'Ed25519' | 'ES256',
    algorithms?: ('EdDSA' | 'Ed25519')[],
  ) => {
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      dpop: { origin: ORIGIN, ...(algorithms === undefined ? {} : { algorithms }) },
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const jkt = await calculateJwkThumbprint(keys.ed.publicJwk as never, 'sha256');
    const accessToken = makeToken({ claims: { cnf: { jkt } } });
    const header = { typ: 'dpop+jwt', alg: headerAlg, jwk: { ...keys.ed.publicJwk, alg: jwkAlg } };
    const claims = {
      ...proofClaims(accessToken, `${ORIGIN}/orders`, clock.seconds()),
    };
    const dpop = signSegments(b64url(header), b64url(claims), headerAlg, keys.ed.privateKey);
    return code(
      await guard.authenticate({
        method: 'POST',
        url: '/orders',
        headers: { authorization: `DPoP ${accessToken}`, dpop },
      }),
    );
  };

  it('takes a proof whose key is named the other way, as for access tokens', async () => {
    expect(await attempt('Ed25519', 'Ed25519')).toBe('ok');
    expect(await attempt('EdDSA', 'EdDSA')).toBe('ok');
    expect(await attempt('Ed25519', 'EdDSA')).toBe('ok');
    expect(await attempt('EdDSA', 'Ed25519')).toBe('ok');
  });

  it('still holds the header to dpop.algorithms, and the key to its own family', async () => {
    // The header's alg is what the policy names: a key named Ed25519 does not bring EdDSA in.
    expect(await attempt('EdDSA', 'Ed25519', ['Ed25519'])).toBe('dpop_proof_invalid');
    expect(await attempt('Ed25519', 'EdDSA', ['Ed25519'])).toBe('ok');
    // An Ed25519 key that names an ECDSA algorithm is refused, as before.
    expect(await attempt('Ed25519', 'ES256')).toBe('dpop_proof_invalid');
  });
});
