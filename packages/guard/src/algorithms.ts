/**
 * The JWS algorithms the guard can verify. `none` is not one of them and cannot be configured.
 *
 * @example
 * jwsAlgorithms.includes('EdDSA'); // true
 */
export const jwsAlgorithms = [
  'HS256',
  'HS384',
  'HS512',
  'RS256',
  'RS384',
  'RS512',
  'PS256',
  'PS384',
  'PS512',
  'ES256',
  'ES384',
  'ES512',
  'EdDSA',
  // RFC 9864's fully-specified name for EdDSA on Ed25519, the one curve the guard takes for EdDSA.
  'Ed25519',
] as const;

/**
 * A JWS algorithm the guard can verify.
 *
 * @example
 * const pinned: JwsAlgorithm[] = ['RS256'];
 */
export type JwsAlgorithm = (typeof jwsAlgorithms)[number];

/** The JWK key type each algorithm needs. */
export type KeyFamily = 'oct' | 'RSA' | 'EC' | 'OKP';

const known = new Set<string>(jwsAlgorithms);

/**
 * True when `value` names an algorithm the guard verifies (exact, case-sensitive: `"None"` is not one).
 *
 * @example
 * isJwsAlgorithm('RS256'); // true
 */
export function isJwsAlgorithm(value: unknown): value is JwsAlgorithm {
  return typeof value === 'string' && known.has(value);
}

/**
 * The key family an algorithm needs. The key decides the algorithm, never the token header: a
 * symmetric algorithm never meets a public key (research cases 9 to 12).
 *
 * @example
 * keyFamilyOf('PS256'); // 'RSA'
 */
export function keyFamilyOf(alg: JwsAlgorithm): KeyFamily {
  if (alg.startsWith('HS')) return 'oct';
  if (alg.startsWith('RS') || alg.startsWith('PS')) return 'RSA';
  if (alg.startsWith('ES')) return 'EC';
  return 'OKP';
}

/**
 * True when a key pinned to `keyAlg` verifies a signature made with `alg`: the same name, or
 * `EdDSA` and `Ed25519` (RFC 9864), one signature scheme on the one curve the guard takes for either.
 * An issuer still names which of the two its tokens may carry (`algorithms`).
 *
 * @example
 * verifiesAs('EdDSA', 'Ed25519'); // true
 */
export function verifiesAs(keyAlg: JwsAlgorithm, alg: JwsAlgorithm): boolean {
  return keyAlg === alg || (keyFamilyOf(keyAlg) === 'OKP' && keyFamilyOf(alg) === 'OKP');
}

/** The curve each ECDSA algorithm is bound to (RFC 7518 §3.4). */
export const ecCurveOf = { ES256: 'P-256', ES384: 'P-384', ES512: 'P-521' } as const;

/** Minimum HMAC key length in bytes: the hash size (RFC 7518 §3.2). */
export const hmacMinimumBytes = { HS256: 32, HS384: 48, HS512: 64 } as const;

/**
 * Throws a `TypeError` unless every entry is a supported algorithm; returns a frozen copy.
 *
 * @example
 * assertAlgorithms(['RS256', 'ES256'], 'algorithms');
 */
export function assertAlgorithms(values: readonly unknown[], name: string): readonly JwsAlgorithm[] {
  if (!Array.isArray(values) || values.length === 0) throw new TypeError(`${name} must be a non-empty array`);
  for (const value of values) {
    if (!isJwsAlgorithm(value)) {
      throw new TypeError(`${name} contains an unsupported algorithm; supported: ${jwsAlgorithms.join(', ')}`);
    }
  }
  return Object.freeze([...values] as JwsAlgorithm[]);
}
