import { createHash, createPrivateKey, createPublicKey, type JsonWebKey, type KeyObject } from 'node:crypto';
import { importJWK, type JWK } from 'jose';
import {
  ecCurveOf,
  hmacMinimumBytes,
  isJwsAlgorithm,
  type JwsAlgorithm,
  keyFamilyOf,
  verifiesAs,
} from './algorithms.js';
import { decodeCanonicalBase64url, isPlainObject } from './compact-jws.js';
import { isRocaModulus } from './roca.js';

/** A key ready to verify signatures of exactly one algorithm. */
export interface VerificationKey {
  kid: string | undefined;
  /** The one algorithm this key verifies; a token naming another algorithm never reaches it. */
  alg: JwsAlgorithm;
  key: CryptoKey;
  /**
   * RFC 7638 thumbprint of the key material: what makes two keys the same key. A `kid` is only a
   * label, and an identity provider may put new material under an old one (or send no `kid` at all).
   */
  thumbprint: string;
}

/** Why a single key was left out of a key set. */
export type KeyDropReason =
  | 'not-an-object'
  | 'wrong-use'
  | 'wrong-key-ops'
  | 'unknown-alg'
  | 'alg-mismatch'
  | 'alg-not-allowed'
  | 'no-allowed-alg'
  | 'symmetric-not-allowed'
  | 'weak-key'
  | 'unsupported-key-type'
  | 'invalid-kid'
  | 'invalid-key';

/**
 * Why a whole key set was refused (the previous set, if any, stays in use). `no-usable-keys` is the
 * remote source's verdict on a set with no key left once the unusable ones are dropped (`{"keys": []}`
 * included); {@link importKeySet} returns such a set as it is, so each dropped key is still reported.
 */
export type KeySetRejection = 'not-a-key-set' | 'private-key' | 'duplicate-kid' | 'mixed-key-types' | 'no-usable-keys';

/** How keys are checked. */
export interface KeyPolicy {
  /** Algorithms the issuer accepts; a key's algorithm must be one of them. */
  algorithms: readonly JwsAlgorithm[];
  /** Whether `oct` (HMAC) keys may be used; never for keys fetched over the network. */
  allowSymmetric: boolean;
}

/** A key that passed every check and only waits for its asynchronous import. */
export interface CheckedKey {
  kid: string | undefined;
  alg: JwsAlgorithm;
  jwk: JWK;
}

const privateMembers = ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth'] as const;

function bytesToBigInt(bytes: Uint8Array): bigint {
  let value = 0n;
  for (const byte of bytes) value = (value << 8n) | BigInt(byte);
  return value;
}

function bitLength(bytes: Uint8Array): number {
  let index = 0;
  while (index < bytes.length && bytes[index] === 0) index++;
  if (index === bytes.length) return 0;
  return (bytes.length - index - 1) * 8 + (32 - Math.clz32(bytes[index] as number));
}

function inferAlgorithm(jwk: Record<string, unknown>, policy: KeyPolicy): JwsAlgorithm | undefined {
  // A JWK without `alg` gets the first algorithm of the issuer's own list that fits its type:
  // pinned by configuration, never chosen by the token header (research case 14).
  for (const alg of policy.algorithms) {
    const family = keyFamilyOf(alg);
    if (family !== jwk.kty) continue;
    if (family === 'EC' && ecCurveOf[alg as keyof typeof ecCurveOf] !== jwk.crv) continue;
    if (family === 'OKP' && jwk.crv !== 'Ed25519') continue;
    return alg;
  }
  return undefined;
}

/**
 * Checks one public JWK (or, when allowed, an HMAC secret as an `oct` JWK) synchronously: use and
 * key_ops, the algorithm binding, key strength (RSA ≥ 2048 bits, odd e ≥ 3, no ROCA modulus; HMAC at
 * least the hash length), and that the key material parses (an EC point must be on its curve).
 *
 * @example
 * checkJwk({ kty: 'OKP', crv: 'Ed25519', x: '...' }, { algorithms: ['EdDSA'], allowSymmetric: false });
 */
export function checkJwk(
  input: unknown,
  policy: KeyPolicy,
): { ok: true; key: CheckedKey } | { ok: false; reason: KeyDropReason } {
  if (!isPlainObject(input)) return { ok: false, reason: 'not-an-object' };
  const jwk = input;
  if (jwk.kid !== undefined && (typeof jwk.kid !== 'string' || jwk.kid.length === 0)) {
    return { ok: false, reason: 'invalid-kid' };
  }
  if (jwk.use !== undefined && jwk.use !== 'sig') return { ok: false, reason: 'wrong-use' };
  if (jwk.key_ops !== undefined && (!Array.isArray(jwk.key_ops) || !jwk.key_ops.includes('verify'))) {
    return { ok: false, reason: 'wrong-key-ops' };
  }
  if (jwk.kty !== 'oct' && jwk.kty !== 'RSA' && jwk.kty !== 'EC' && jwk.kty !== 'OKP') {
    return { ok: false, reason: 'unsupported-key-type' };
  }
  let alg: JwsAlgorithm | undefined;
  if (jwk.alg !== undefined) {
    // RFC 7520's first drafts named the P-521 algorithm "ES521"; it can only mean ES512 on P-521.
    const named = jwk.alg === 'ES521' && jwk.crv === 'P-521' ? 'ES512' : jwk.alg;
    if (!isJwsAlgorithm(named)) return { ok: false, reason: 'unknown-alg' };
    if (keyFamilyOf(named) !== jwk.kty) return { ok: false, reason: 'alg-mismatch' };
    if (keyFamilyOf(named) === 'EC' && ecCurveOf[named as keyof typeof ecCurveOf] !== jwk.crv) {
      return { ok: false, reason: 'alg-mismatch' };
    }
    // A key named for EdDSA serves an issuer that allows Ed25519 (RFC 9864), and the other way round.
    if (!policy.algorithms.some((allowed) => verifiesAs(named, allowed)))
      return { ok: false, reason: 'alg-not-allowed' };
    alg = named;
  } else {
    alg = inferAlgorithm(jwk, policy);
    if (alg === undefined) return { ok: false, reason: 'no-allowed-alg' };
  }
  const kid = jwk.kid as string | undefined;

  if (jwk.kty === 'oct') {
    if (!policy.allowSymmetric) return { ok: false, reason: 'symmetric-not-allowed' };
    const secret = typeof jwk.k === 'string' ? decodeCanonicalBase64url(jwk.k) : undefined;
    if (secret === undefined) return { ok: false, reason: 'invalid-key' };
    if (secret.length < hmacMinimumBytes[alg as keyof typeof hmacMinimumBytes])
      return { ok: false, reason: 'weak-key' };
    return { ok: true, key: { kid, alg, jwk: { kty: 'oct', k: jwk.k as string } } };
  }

  let publicJwk: JWK;
  if (jwk.kty === 'RSA') {
    const n = typeof jwk.n === 'string' ? decodeCanonicalBase64url(jwk.n) : undefined;
    const e = typeof jwk.e === 'string' ? decodeCanonicalBase64url(jwk.e) : undefined;
    if (n === undefined || e === undefined || e.length > 8) return { ok: false, reason: 'invalid-key' };
    const exponent = bytesToBigInt(e);
    const modulus = bytesToBigInt(n);
    if (bitLength(n) < 2048 || exponent < 3n || exponent % 2n === 0n || isRocaModulus(modulus)) {
      return { ok: false, reason: 'weak-key' };
    }
    publicJwk = { kty: 'RSA', n: jwk.n as string, e: jwk.e as string };
  } else if (jwk.kty === 'EC') {
    publicJwk = { kty: 'EC', crv: jwk.crv as string, x: jwk.x as string, y: jwk.y as string };
  } else {
    if (jwk.crv !== 'Ed25519') return { ok: false, reason: 'unsupported-key-type' };
    publicJwk = { kty: 'OKP', crv: 'Ed25519', x: jwk.x as string };
  }
  try {
    // Parses the material now (curve membership, encodings) so a bad key fails at load, not per request.
    createPublicKey({ key: publicJwk as JsonWebKey, format: 'jwk' });
  } catch {
    return { ok: false, reason: 'invalid-key' };
  }
  return { ok: true, key: { kid, alg, jwk: publicJwk } };
}

/**
 * Imports a checked key as a non-extractable `CryptoKey` for its one algorithm.
 *
 * @example
 * const key = await importCheckedKey(checked.key);
 */
export async function importCheckedKey(checked: CheckedKey): Promise<VerificationKey> {
  const thumbprint = jwkThumbprint(checked.jwk);
  if (checked.jwk.kty === 'oct') {
    const hash = `SHA-${checked.alg.slice(2)}`;
    const raw = decodeCanonicalBase64url(checked.jwk.k as string) as Uint8Array<ArrayBuffer>;
    const key = await crypto.subtle.importKey('raw', raw, { name: 'HMAC', hash }, false, ['verify']);
    return { kid: checked.kid, alg: checked.alg, key, thumbprint };
  }
  const key = (await importJWK(checked.jwk, checked.alg)) as CryptoKey;
  return { kid: checked.kid, alg: checked.alg, key, thumbprint };
}

/**
 * RFC 7638 thumbprint of a JWK: SHA-256 over its required members in lexicographic order, base64url.
 * It names the key material (a DPoP proof's `cnf.jkt`, an internal signing key's default `kid`, the
 * identity of a JWKS key across refreshes). Synchronous, unlike jose's, for the paths that cannot wait.
 *
 * @example
 * jwkThumbprint({ kty: 'OKP', crv: 'Ed25519', x: '11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo' });
 */
export function jwkThumbprint(jwk: JWK): string {
  const members =
    jwk.kty === 'RSA'
      ? { e: jwk.e, kty: jwk.kty, n: jwk.n }
      : jwk.kty === 'EC'
        ? { crv: jwk.crv, kty: jwk.kty, x: jwk.x, y: jwk.y }
        : jwk.kty === 'oct'
          ? { k: jwk.k, kty: jwk.kty }
          : { crv: jwk.crv, kty: jwk.kty, x: jwk.x };
  return createHash('sha256').update(JSON.stringify(members)).digest('base64url');
}

/** The outcome of {@link importKeySet}. */
export type KeySetResult =
  | { ok: true; keys: VerificationKey[]; dropped: Array<{ kid: string | undefined; reason: KeyDropReason }> }
  | { ok: false; reason: KeySetRejection };

// Drop reasons of a key published as a verification key this verifier could use, but broken. Such a key
// still competes for its kid (Wycheproof json_web_key tcId 4: two HS256 keys, one with a non-canonical
// `k`); the other reasons say the key was never meant for this verifier.
const brokenVerificationKey: ReadonlySet<KeyDropReason> = new Set(['invalid-key', 'weak-key', 'alg-mismatch']);

function claimsToVerify(entry: { reason: KeyDropReason }): boolean {
  return brokenVerificationKey.has(entry.reason);
}

/**
 * What a `kid` may name once: one key per algorithm. Every key is pinned to one algorithm and a
 * lookup asks for the token's, so one key listed for RS256 and for PS256 under one `kid` never
 * competes with itself; two keys for one algorithm would. Shared by fetched and configured keys.
 *
 * @example
 * kidSlot('k1', 'RS256') === kidSlot('k1', 'PS256'); // false
 */
export function kidSlot(kid: string, alg: JwsAlgorithm): string {
  return `${alg} ${kid}`;
}

/**
 * Imports a JWKS. The whole set is refused when it is not `{ keys: [...] }`, holds private key
 * material, gives one `kid` to two keys it would verify one algorithm with, or mixes symmetric and asymmetric keys
 * (Wycheproof `MixedKeySet`, `DuplicateKid`). Single unusable keys are dropped and reported. A `kid`
 * shared with a key that is not meant for this verifier (another `use` or `key_ops`, a key type or
 * algorithm outside the policy: RFC 7517 4.5 lets keys of different types share one) refuses nothing.
 * A `kid` shared with a key that claims to verify but is broken (invalid, weak, its `alg` contradicting
 * its type) still refuses the set: which of the two the issuer signs with is then anyone's guess.
 *
 * @example
 * const result = await importKeySet(await response.json(), { algorithms: ['RS256'], allowSymmetric: false });
 */
export async function importKeySet(input: unknown, policy: KeyPolicy): Promise<KeySetResult> {
  if (!isPlainObject(input) || !Array.isArray(input.keys)) return { ok: false, reason: 'not-a-key-set' };
  let symmetric = false;
  let asymmetric = false;
  for (const entry of input.keys) {
    if (!isPlainObject(entry)) continue;
    if (privateMembers.some((member) => member in entry)) return { ok: false, reason: 'private-key' };
    if (entry.kty === 'oct') symmetric = true;
    else asymmetric = true;
  }
  if (symmetric && asymmetric) return { ok: false, reason: 'mixed-key-types' };
  const keys: VerificationKey[] = [];
  const dropped: Array<{ kid: string | undefined; reason: KeyDropReason }> = [];
  for (const entry of input.keys) {
    const checked = checkJwk(entry, policy);
    const kid = isPlainObject(entry) && typeof entry.kid === 'string' ? entry.kid : undefined;
    if (!checked.ok) {
      dropped.push({ kid, reason: checked.reason });
      continue;
    }
    try {
      keys.push(await importCheckedKey(checked.key));
    } catch {
      dropped.push({ kid, reason: 'invalid-key' });
    }
  }
  // A kid is a duplicate when two keys would both be taken for one token (kidSlot): one RSA key
  // published for RS256 and for PS256 under one kid (Keycloak, FAPI providers) is not. A broken
  // key's algorithm is not to be trusted: it contends for every algorithm of its kid.
  const taken = new Set<string>();
  for (const key of keys) {
    if (key.kid === undefined) continue;
    const slot = kidSlot(key.kid, key.alg);
    if (taken.has(slot)) return { ok: false, reason: 'duplicate-kid' };
    taken.add(slot);
  }
  const named = new Set(keys.flatMap((key) => (key.kid === undefined ? [] : [key.kid])));
  for (const entry of dropped.filter(claimsToVerify)) {
    if (entry.kid === undefined) continue;
    if (named.has(entry.kid)) return { ok: false, reason: 'duplicate-kid' };
    named.add(entry.kid);
  }
  return { ok: true, keys, dropped };
}

/**
 * Turns a PEM public key or certificate (SPKI, PKCS#1 `RSA PUBLIC KEY`, X.509) into a JWK.
 * Throws a `TypeError` when the text is not a public key.
 *
 * @example
 * const jwk = pemToJwk(readFileSync('issuer.pub', 'utf8'));
 */
export function pemToJwk(pem: string): Record<string, unknown> {
  // createPublicKey derives the public half of a private key without a word: taken so, the signing key
  // (the gateway's, an identity provider's) sits in every verifier's configuration, as a private JWK,
  // which is refused, never does.
  if (parsesAsPrivateKey(pem)) {
    throw new TypeError('publicKeys: a PEM entry is a private key; configure its public key (SPKI) or certificate');
  }
  let keyObject: KeyObject;
  try {
    keyObject = createPublicKey(pem);
  } catch (cause) {
    throw new TypeError('publicKeys: a PEM entry is not a public key or certificate', { cause });
  }
  try {
    return publicJwkOf(keyObject);
  } catch (cause) {
    // DSA and DH keys have no JWK form (Node throws a plain Error): no JWS algorithm verifies with them
    // (CVE-2022-23539), and a bad option is a TypeError that names it.
    throw new TypeError(
      `publicKeys: a PEM entry is a ${keyObject.asymmetricKeyType} key, which no JWS algorithm uses`,
      {
        cause,
      },
    );
  }
}

function parsesAsPrivateKey(pem: string): boolean {
  try {
    createPrivateKey(pem);
    return true;
  } catch {
    // A public key, a certificate, or no key at all: createPublicKey below tells them apart.
    return false;
  }
}

// The members of a public JWK (RFC 7518 6.2.1, 6.3.1; RFC 8037 2), and nothing else.
const publicMembers = ['kty', 'crv', 'x', 'y', 'n', 'e'] as const;

/**
 * A public key as a JWK of its public members only. Node's `export({ format: 'jwk' })` gives just
 * those; workerd's (Cloudflare Workers with nodejs_compat) lists every member JWK defines, the
 * private ones (`d`, `p`, `k`...) as `undefined`, and adds `alg: 'EdDSA'` to Ed25519 keys. Taken as
 * it is, such a JWK reads as private material (a PEM key or the gateway's own JWKS would be refused)
 * and pins an Ed25519 key to `EdDSA`. Picking the members by name gives the same JWK everywhere,
 * and one that can never carry more than the public key.
 *
 * @example
 * const jwk = publicJwkOf(createPublicKey(pem)); // { kty: 'OKP', crv: 'Ed25519', x: '...' }
 */
export function publicJwkOf(key: KeyObject): Record<string, string> {
  const exported = key.export({ format: 'jwk' }) as Record<string, unknown>;
  const jwk: Record<string, string> = {};
  for (const member of publicMembers) {
    const value = exported[member];
    if (typeof value === 'string') jwk[member] = value;
  }
  return jwk;
}
