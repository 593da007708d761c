// The key a hand-written jose.jwtVerify call uses in the guard benchmarks, imported once.
import { importJWK } from 'jose';

/**
 * The verification key of `spec` (`alg`, `secret` for HS256, `publicJwk` otherwise). Given a
 * secret's bytes, jose would import an HMAC key on every call: it is imported once here instead, as
 * the public keys are, so a baseline pays for verification only.
 *
 * @example
 * const key = await joseKey({ alg: 'HS256', secret: 'at-least-32-bytes-of-secret...' });
 */
export async function joseKey(spec) {
  if (spec.alg !== 'HS256') return importJWK({ ...spec.publicJwk }, spec.alg);
  return crypto.subtle.importKey(
    'raw',
    new TextEncoder().encode(spec.secret),
    { name: 'HMAC', hash: 'SHA-256' },
    false,
    ['verify'],
  );
}
