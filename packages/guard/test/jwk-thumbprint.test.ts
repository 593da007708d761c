import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { calculateJwkThumbprint, type JWK } from 'jose';
import { describe, expect, it } from 'vitest';
import { jwkThumbprint } from '../src/key-import.js';

// One RFC 7638 thumbprint serves DPoP's `cnf.jkt`, the internal signing key's default kid and the
// identity of a JWKS key across refreshes: it must be the thumbprint jose (and everyone else) computes.
describe('jwkThumbprint', () => {
  it("gives RFC 7638 section 3.1's example value", () => {
    const rfcKey = {
      kty: 'RSA',
      n:
        '0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMs' +
        'tn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n' +
        '91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw',
      e: 'AQAB',
      alg: 'RS256',
      kid: '2011-04-29',
    };
    expect(jwkThumbprint(rfcKey)).toBe('NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs');
  });

  it('matches jose for every key type, whatever other members the JWK carries', async () => {
    const keys: JWK[] = [
      generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey.export({ format: 'jwk' }) as JWK,
      generateKeyPairSync('ed25519').publicKey.export({ format: 'jwk' }) as JWK,
      generateKeyPairSync('rsa', { modulusLength: 2048 }).publicKey.export({ format: 'jwk' }) as JWK,
      { kty: 'oct', k: randomBytes(32).toString('base64url') },
    ];
    for (const key of keys) {
      const labelled = { ...key, kid: 'k1', use: 'sig', alg: 'whatever' };
      expect(jwkThumbprint(labelled), key.kty).toBe(await calculateJwkThumbprint(key, 'sha256'));
    }
  });
});
