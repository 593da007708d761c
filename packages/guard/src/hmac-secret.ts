import { createPrivateKey, createPublicKey, X509Certificate } from 'node:crypto';
import { hmacMinimumBytes } from './algorithms.js';

// The DER forms a key or certificate travels in. node:crypto (OpenSSL) parses each strictly: a DER
// structure has to be well-formed all the way down (tags, lengths that add up exactly, a known
// algorithm identifier, valid key material), which random bytes practically never are.
const derParsers: ReadonlyArray<(der: Buffer) => unknown> = [
  (der) => createPublicKey({ key: der, format: 'der', type: 'spki' }),
  (der) => createPublicKey({ key: der, format: 'der', type: 'pkcs1' }),
  (der) => new X509Certificate(der),
  (der) => createPrivateKey({ key: der, format: 'der', type: 'pkcs8' }),
  (der) => createPrivateKey({ key: der, format: 'der', type: 'pkcs1' }),
  (der) => createPrivateKey({ key: der, format: 'der', type: 'sec1' }),
];

// Every DER structure above is an ASN.1 SEQUENCE: a first byte of 0x30. Checked first, so the
// parsers run on about one random secret in 256, and only at startup anyway.
const derSequenceTag = 0x30;

function parsesAsDer(bytes: Buffer): boolean {
  if (bytes.length === 0 || bytes[0] !== derSequenceTag) return false;
  for (const parse of derParsers) {
    try {
      parse(bytes);
      return true;
    } catch {
      // not this form
    }
  }
  return false;
}

// The text encodings a DER blob is pasted in: base64 (a PEM body without its armour, an `x5c`
// entry), base64url (a JWK member) and hex (`xxd -p`). Whitespace and line breaks are ignored.
function decodings(text: string): Buffer[] {
  const compact = text.replace(/\s+/g, '');
  const decoded: Buffer[] = [];
  if (/^[A-Za-z0-9+/]+={0,2}$/.test(compact)) decoded.push(Buffer.from(compact, 'base64'));
  if (/^[A-Za-z0-9_-]+={0,2}$/.test(compact)) decoded.push(Buffer.from(compact, 'base64url'));
  if (/^(?:[0-9a-fA-F]{2})+$/.test(compact)) decoded.push(Buffer.from(compact, 'hex'));
  return decoded;
}

function parsesAsJsonKey(text: string): boolean {
  // A JWK or a JWKS (`{ "keys": [...] }`, or its `keys` array alone). Anything starting with `{` is
  // refused as before, JSON or not (a JWK copied with a trailing comma is still a JWK).
  return text.startsWith('{') || parsesAsJson(text);
}

/**
 * Why `secret` is key material rather than a shared secret, or `undefined` when it is not. Using a
 * public key as an HMAC secret is the classic RS/HS confusion setup (research cases 9 to 11,
 * CVE-2015-9235, fast-jwt GHSA-8wpc-h4q6-8fxv): whoever holds the public key can then sign tokens.
 * Checked, for text and for bytes alike (a `readFileSync('idp.pem')` without an encoding is bytes):
 * - PEM armour anywhere (`-----BEGIN`), so a comment line before a certificate does not hide it;
 * - an OpenSSH public key (`ssh-ed25519 AAAA...`);
 * - a JWK or JWKS as JSON text (an object, or an array);
 * - anything node:crypto parses as a key or certificate: PEM text, DER bytes, and DER in base64,
 *   base64url or hex;
 * - any of these text forms encoded once more in base64, base64url or hex.
 * A random secret is none of these: it never holds the armour, and a random byte string is not a
 * well-formed DER structure. What cannot be told apart from random bytes is not refused: a bare RSA
 * modulus or EC coordinate is indistinguishable from a random secret of that length.
 *
 * @example
 * keyMaterialIn(readFileSync('idp.pem')); // 'PEM'
 * keyMaterialIn(randomBytes(32)); // undefined
 */
export function keyMaterialIn(secret: string | Uint8Array): string | undefined {
  const bytes = typeof secret === 'string' ? Buffer.from(secret, 'utf8') : Buffer.from(secret);
  // Binary that is not UTF-8: only its DER reading applies.
  const text = typeof secret === 'string' ? secret : utf8(bytes);
  if (text !== undefined) {
    const trimmed = trimText(text);
    const found = textKeyMaterial(trimmed, parsesAsJsonKey);
    if (found !== undefined) return found;
    for (const decoded of decodings(trimmed)) {
      if (parsesAsDer(decoded)) return 'encoded DER key or certificate';
      // A PEM file or a JWK encoded once more (a Kubernetes Secret's value used as it is, `xxd -p`):
      // the same text checks on the decoded text, with JSON strictly parsed this time.
      const inner = utf8(decoded);
      const wrapped = inner === undefined ? undefined : textKeyMaterial(trimText(inner), parsesAsJson);
      if (wrapped !== undefined) return `encoded ${wrapped}`;
    }
  }
  if (parsesAsDer(bytes)) return 'DER key or certificate';
  return undefined;
}

function trimText(text: string): string {
  return text.replace(/^[\s\u200b\ufeff]+/, '').trimEnd();
}

function utf8(bytes: Buffer): string | undefined {
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    return undefined;
  }
}

// PEM armour, an OpenSSH public key, or a JWK/JWKS (as `isJson` reads it), in text.
function textKeyMaterial(text: string, isJson: (text: string) => boolean): string | undefined {
  if (text.includes('-----BEGIN')) return 'PEM';
  if (/^(?:ssh-(?:rsa|dss|ed25519|ed448)|ecdsa-sha2-nistp\d+|sk-\S+@openssh\.com) /.test(text)) {
    return 'OpenSSH public key';
  }
  if (isJson(text)) return 'JWK or JWKS';
  return undefined;
}

// Strict: an object or an array that parses, for text decoded from base64 or hex, where a stray
// `{` is more likely chance than a JWK.
function parsesAsJson(text: string): boolean {
  if (!text.startsWith('{') && !text.startsWith('[')) return false;
  try {
    const value: unknown = JSON.parse(text);
    return typeof value === 'object' && value !== null;
  } catch {
    return false;
  }
}

/**
 * Turns a configured HMAC secret into an `oct` JWK, refusing key material with a `TypeError` (the
 * message names the kind of material found, never the secret).
 *
 * @example
 * const jwk = secretToJwk(process.env.LEGACY_HS256_SECRET ?? ''); // { kty: 'oct', k: '...' }
 */
export function secretToJwk(secret: string | Uint8Array): Record<string, unknown> {
  if (typeof secret !== 'string' && !(secret instanceof Uint8Array)) {
    throw new TypeError('secret must be a string or bytes');
  }
  const found = keyMaterialIn(secret);
  if (found !== undefined) {
    throw new TypeError(
      `secret looks like key material (${found}), not a shared secret; configure public keys with publicKeys instead`,
    );
  }
  const bytes = typeof secret === 'string' ? Buffer.from(secret, 'utf8') : Buffer.from(secret);
  return { kty: 'oct', k: bytes.toString('base64url') };
}

/**
 * Why `secret` is too weak for `alg`, or `undefined` when it is not. RFC 7518 §3.2 requires at least
 * the hash output (32, 48 or 64 bytes); a string is used as its UTF-8 bytes, so those are counted, not
 * its characters. A secret of one byte repeated is refused at any length: it carries 8 bits at most,
 * and no generated secret of 32 bytes or more is one (odds of 2^-248): it is a placeholder
 * (`'x'.repeat(32)`) or a buffer never filled (`new Uint8Array(32)`). The reason names lengths only,
 * never a byte of the secret.
 *
 * @example
 * secretWeakness('x'.repeat(31) + 'y', 'HS384'); // 'a HS384 secret must be at least 48 bytes (RFC 7518 §3.2); this one is 32'
 */
export function secretWeakness(secret: string | Uint8Array, alg: keyof typeof hmacMinimumBytes): string | undefined {
  const bytes = typeof secret === 'string' ? Buffer.from(secret, 'utf8') : secret;
  const minimum = hmacMinimumBytes[alg];
  if (bytes.length < minimum) {
    return `a ${alg} secret must be at least ${minimum} bytes (RFC 7518 §3.2); this one is ${bytes.length}`;
  }
  if (bytes.every((byte) => byte === bytes[0])) return 'the secret is one byte repeated; use random bytes';
  return undefined;
}
