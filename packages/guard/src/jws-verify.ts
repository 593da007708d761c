import { compactVerify, errors as joseErrors } from 'jose';
import { isJwsAlgorithm, type JwsAlgorithm } from './algorithms.js';
import type { ParsedJws } from './compact-jws.js';
import type { GuardErrorCode } from './errors.js';
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
 * (`none` in any case is not), `kid` and `typ` are strings, `crit` names only understood parameters
 * that are present (RFC 7515 §4.1.11), and nothing in {@link refusedHeaderParameters} appears.
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
  // A nested JWT (`cty: JWT`) would need a second verification: refused (RFC 8725 §3.3).
  if (typeof header.cty === 'string' && header.cty.toUpperCase() === 'JWT')
    return { ok: false, code: 'header_unsupported' };
  if (header.crit !== undefined) {
    const crit = header.crit;
    if (!Array.isArray(crit) || crit.length === 0) return { ok: false, code: 'header_unsupported' };
    for (const name of crit) {
      if (typeof name !== 'string' || !understoodCrit.includes(name) || !(name in header)) {
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
 * Verifies the signature of a compact JWS with candidate keys, each pinned to one algorithm: a key
 * whose algorithm is not the header's is never tried. The crypto is jose's (WebCrypto `verify`, which
 * compares MACs in constant time); jose also re-checks `crit` and the key type against the algorithm.
 *
 * @example
 * const result = await verifyJwsSignature(token, 'RS256', keys, []);
 */
export async function verifyJwsSignature(
  token: string,
  alg: JwsAlgorithm,
  keys: readonly VerificationKey[],
  understoodCrit: readonly string[],
): Promise<{ ok: true } | { ok: false; code: GuardErrorCode }> {
  const crit = Object.fromEntries(understoodCrit.map((name) => [name, true]));
  let sawCandidate = false;
  for (const key of keys) {
    if (key.alg !== alg) continue;
    sawCandidate = true;
    try {
      await compactVerify(token, key.key, { algorithms: [alg], crit });
      return { ok: true };
    } catch (error) {
      if (error instanceof joseErrors.JWSSignatureVerificationFailed) continue;
      if (error instanceof joseErrors.JOSENotSupported) return { ok: false, code: 'header_unsupported' };
      return { ok: false, code: 'signature_invalid' };
    }
  }
  return { ok: false, code: sawCandidate ? 'signature_invalid' : 'algorithm_not_allowed' };
}

/**
 * Header check plus signature check of an already parsed JWS against a fixed key list; the JWS layer
 * of the guard, without any JWT rule. Used for the Wycheproof JWS vectors.
 *
 * @example
 * const parsed = parseCompactJws(token);
 * if (parsed.ok) await verifyParsedJws(token, parsed.value, keys, []);
 */
export async function verifyParsedJws(
  token: string,
  parsed: ParsedJws,
  keys: readonly VerificationKey[],
  understoodCrit: readonly string[],
): Promise<{ ok: true; header: CheckedHeader } | { ok: false; code: GuardErrorCode }> {
  const header = checkJwsHeader(parsed.header, understoodCrit);
  if (!header.ok) return header;
  const candidates = keys.filter(
    (key) =>
      key.alg === header.header.alg &&
      (header.header.kid === undefined || key.kid === undefined || key.kid === header.header.kid),
  );
  const verified = await verifyJwsSignature(token, header.header.alg, candidates, understoodCrit);
  return verified.ok ? { ok: true, header: header.header } : verified;
}
