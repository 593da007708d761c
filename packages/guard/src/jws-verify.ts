import { isJwsAlgorithm, type JwsAlgorithm, verifiesAs } from './algorithms.js';
import type { ParsedJws } from './compact-jws.js';
import type { GuardErrorCode } from './errors.js';
import { normalizeTyp } from './guard-typ.js';
import type { VerificationKey } from './key-import.js';

/**
 * Header parameters the guard refuses outright. `jku`, `x5u` and `jwk` ask the verifier to fetch or
 * trust a key named by the token itself (RFC 8725 §3.10, CVE-2018-0114); `b64` changes what is signed
 * (RFC 7797, never for JWTs); `zip`, `enc`, `epk`, `p2c` belong to JWE, which a guard never decrypts.
 */
const refusedHeaderParameters = ['jku', 'x5u', 'jwk', 'b64', 'zip', 'enc', 'epk', 'p2s', 'p2c'] as const;

/** The algorithm and key id of a header that passed {@link checkJwsHeader}. */
export interface CheckedHeader {
  alg: JwsAlgorithm;
  kid: string | undefined;
  typ: string | undefined;
}

/**
 * Checks a protected header before any key lookup or crypto: `alg` is a supported algorithm
 * (`none` in any case is not), `kid` and `typ` are strings, `crit` is a list of distinct non-empty
 * names this deployment understands, each present in the header itself (RFC 7515 §4.1.11), and nothing
 * in {@link refusedHeaderParameters} appears. This is every header rule jose's `compactVerify` applies
 * and more, so the signature check below needs no second parse of the header.
 *
 * @example
 * checkJwsHeader({ alg: 'RS256', kid: 'k1' }, []); // { ok: true, header: { alg: 'RS256', kid: 'k1', typ: undefined } }
 */
export function checkJwsHeader(
  header: Record<string, unknown>,
  understoodCrit: readonly string[],
): { ok: true; header: CheckedHeader } | { ok: false; code: GuardErrorCode } {
  if (!isJwsAlgorithm(header.alg)) return { ok: false, code: 'algorithm_not_allowed' };
  if (header.kid !== undefined && (typeof header.kid !== 'string' || header.kid.length > 1024)) {
    return { ok: false, code: 'token_malformed' };
  }
  if (header.typ !== undefined && typeof header.typ !== 'string') return { ok: false, code: 'token_malformed' };
  for (const name of refusedHeaderParameters) if (name in header) return { ok: false, code: 'header_unsupported' };
  // A nested JWT (`cty: JWT`) would need a second verification: refused (RFC 8725 §3.3). Media types
  // are case-insensitive and `application/` may be left out (RFC 7515 §4.1.10), so `application/jwt`
  // is the same value.
  if (typeof header.cty === 'string' && normalizeTyp(header.cty) === 'jwt')
    return { ok: false, code: 'header_unsupported' };
  if (header.crit !== undefined) {
    const crit = header.crit;
    if (!Array.isArray(crit) || crit.length === 0) return { ok: false, code: 'header_unsupported' };
    for (let index = 0; index < crit.length; index++) {
      const name: unknown = crit[index];
      // Own members only: `toString` is "in" every object through its prototype, never in the header.
      if (
        typeof name !== 'string' ||
        name.length === 0 ||
        !understoodCrit.includes(name) ||
        !Object.hasOwn(header, name) ||
        crit.indexOf(name) !== index
      ) {
        return { ok: false, code: 'header_unsupported' };
      }
    }
  }
  return {
    ok: true,
    header: { alg: header.alg, kid: header.kid as string | undefined, typ: header.typ as string | undefined },
  };
}

/**
 * The WebCrypto parameters of each algorithm's `verify` call (RFC 7518 §3.3-3.5, RFC 8037; the
 * values jose passes). A key is imported for exactly one algorithm, so its `CryptoKey` already names
 * the hash, the curve and, for RSA, a modulus of at least 2048 bits (checked before import).
 */
const verifyParameters: Readonly<Record<JwsAlgorithm, AlgorithmIdentifier | RsaPssParams | EcdsaParams>> = {
  HS256: { name: 'HMAC' },
  HS384: { name: 'HMAC' },
  HS512: { name: 'HMAC' },
  RS256: { name: 'RSASSA-PKCS1-v1_5' },
  RS384: { name: 'RSASSA-PKCS1-v1_5' },
  RS512: { name: 'RSASSA-PKCS1-v1_5' },
  PS256: { name: 'RSA-PSS', saltLength: 32 },
  PS384: { name: 'RSA-PSS', saltLength: 48 },
  PS512: { name: 'RSA-PSS', saltLength: 64 },
  ES256: { name: 'ECDSA', hash: 'SHA-256' },
  ES384: { name: 'ECDSA', hash: 'SHA-384' },
  ES512: { name: 'ECDSA', hash: 'SHA-512' },
  EdDSA: { name: 'Ed25519' },
  Ed25519: { name: 'Ed25519' },
};

/**
 * Verifies the signature of a JWS that {@link parseCompactJws} split and decoded, with candidate keys
 * each pinned to one algorithm: a key whose algorithm is not `alg` is never tried. The crypto is
 * WebCrypto's `verify` on the `CryptoKey` imported at configuration (MACs compared in constant time), called
 * directly on the bytes already decoded: jose's `compactVerify` would split, decode and parse the
 * token a second time, and its header rules are a subset of {@link checkJwsHeader}, which every
 * caller applies first. A `verify` that throws (a signature of the wrong length for an ECDSA key,
 * say) is a failed signature, as in jose.
 *
 * @example
 * const parsed = parseCompactJws(token);
 * if (parsed.ok) await verifyJwsSignature(parsed.value, 'RS256', keys);
 */
export async function verifyJwsSignature(
  parsed: ParsedJws,
  alg: JwsAlgorithm,
  keys: readonly VerificationKey[],
): Promise<{ ok: true } | { ok: false; code: GuardErrorCode }> {
  const parameters = verifyParameters[alg];
  let signingInput: Uint8Array<ArrayBuffer> | undefined;
  let sawCandidate = false;
  for (const key of keys) {
    if (!verifiesAs(key.alg, alg)) continue;
    sawCandidate = true;
    // The segments passed the base64url alphabet check, so the signing input is ASCII: latin1 is exact.
    signingInput ??= signingInputBytes(parsed.signingInput);
    try {
      if (await crypto.subtle.verify(parameters, key.key, parsed.signature, signingInput)) return { ok: true };
    } catch {
      // Same outcome as a mismatch: try the next candidate.
    }
  }
  return { ok: false, code: sawCandidate ? 'signature_invalid' : 'algorithm_not_allowed' };
}

function signingInputBytes(text: string): Uint8Array<ArrayBuffer> {
  const bytes = Buffer.from(text, 'latin1');
  return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength) as Uint8Array<ArrayBuffer>;
}

/**
 * Header check plus signature check of an already parsed JWS against a fixed key list; the JWS layer
 * of the guard, without any JWT rule. Used for the Wycheproof JWS vectors.
 *
 * @example
 * const parsed = parseCompactJws(token);
 * if (parsed.ok) await verifyParsedJws(parsed.value, keys, []);
 */
export async function verifyParsedJws(
  parsed: ParsedJws,
  keys: readonly VerificationKey[],
  understoodCrit: readonly string[],
): Promise<{ ok: true; header: CheckedHeader } | { ok: false; code: GuardErrorCode }> {
  const header = checkJwsHeader(parsed.header, understoodCrit);
  if (!header.ok) return header;
  const candidates = keys.filter(
    (key) =>
      verifiesAs(key.alg, header.header.alg) &&
      (header.header.kid === undefined || key.kid === undefined || key.kid === header.header.kid),
  );
  const verified = await verifyJwsSignature(parsed, header.header.alg, candidates);
  return verified.ok ? { ok: true, header: header.header } : verified;
}
