// RFC 9864 (fully-specified algorithms) names EdDSA on Ed25519 `Ed25519`. Issuers and DPoP clients
// moving to it send `alg: "Ed25519"` tokens, and JWKS keys may be named either way; the guard only
// took `EdDSA`, so such tokens were refused (unknown algorithm) and such keys dropped.
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { describe, expect, it } from 'vitest';
import { createGuard, type IssuerOptions } from '../src/index.js';
import { manualClock, START_MS } from './support/tokens.js';

const ISSUER = 'https://issuer.fully-specified.example';
const AUDIENCE = 'orders-api';

describe('EdDSA under its RFC 9864 name, Ed25519', async () => {
  const { publicKey, privateKey } = await generateKeyPair('Ed25519');
  const jwk = await exportJWK(publicKey);
  const token = (alg: 'EdDSA' | 'Ed25519') =>
    new SignJWT({ sub: 'user-1', scope: 'orders:read' })
      .setProtectedHeader({ alg, typ: 'at+jwt', kid: 'k1' })
      .setIssuer(ISSUER)
      .setAudience(AUDIENCE)
      .setIssuedAt(START_MS / 1000)
      .setExpirationTime(START_MS / 1000 + 300)
      .sign(privateKey);
  const guard = (keyAlg: string | undefined, options: Partial<IssuerOptions> = {}) =>
    createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [
        {
          issuer: ISSUER,
          jwks: { keys: [{ ...jwk, kid: 'k1', ...(keyAlg === undefined ? {} : { alg: keyAlg }) }] },
          ...options,
        },
      ],
    });
  const code = async (verifying: ReturnType<typeof guard>, alg: 'EdDSA' | 'Ed25519') => {
    const result = await verifying.verify(await token(alg));
    return result.ok ? 'ok' : result.error.code;
  };

  it('verifies either name with a key named either way, or not named, by default', async () => {
    for (const keyAlg of ['EdDSA', 'Ed25519', undefined]) {
      const verifying = guard(keyAlg);
      expect(await code(verifying, 'Ed25519'), `key ${keyAlg}`).toBe('ok');
      expect(await code(verifying, 'EdDSA'), `key ${keyAlg}`).toBe('ok');
    }
  });

  it('keeps an issuer to the names it lists: EdDSA only refuses Ed25519 tokens, though its key may say Ed25519', async () => {
    const verifying = guard('Ed25519', { algorithms: ['EdDSA'] });
    expect(await code(verifying, 'EdDSA')).toBe('ok');
    expect(await code(verifying, 'Ed25519')).not.toBe('ok');
  });
});
