import {
  createHmac,
  createPrivateKey,
  createPublicKey,
  type KeyObject,
  randomBytes,
  sign,
  timingSafeEqual,
  verify,
} from 'node:crypto';
import { WebhookError } from './errors.js';

/**
 * A webhook secret as Standard Webhooks writes it:
 * - `whsec_<base64>`: a symmetric `v1` (HMAC-SHA256) secret; the bare base64 without prefix is accepted too;
 * - `whsk_<base64>`: an Ed25519 private key for `v1a` (32-byte seed, or seed followed by public key);
 * - `whpk_<base64>`: an Ed25519 public key, for verifying `v1a` only;
 * - a `Uint8Array`: the raw bytes of a `v1` secret.
 */
export type WebhookSecret = string | Uint8Array;

/** A signature scheme version this package implements. */
export type SignatureVersion = 'v1' | 'v1a';

/** A parsed key that can produce signatures. */
export interface SigningKey {
  readonly version: SignatureVersion;
  /** The base64 signature of `content`. */
  sign(content: Buffer): string;
}

/** A parsed key that can check signatures. */
export interface VerifyingKey {
  readonly version: SignatureVersion;
  /** True when `signature` (decoded bytes) is valid for `content`. Never throws on bad input. */
  verify(content: Buffer, signature: Buffer): boolean;
  /**
   * A check of signatures (decoded bytes) of `content`: true for a valid one, never throws on bad
   * input. Made once per delivery, so an HMAC key computes its one expected signature once, however
   * many entries the header carries (each would otherwise cost an HMAC of the whole body).
   */
  checkerFor(content: Buffer): (signature: Buffer) => boolean;
}

/** A parsed secret: always verifies; signs unless it is a public key. */
export interface ParsedSecret extends VerifyingKey {
  readonly signer: SigningKey | undefined;
}

// Shorter HMAC keys can be brute-forced offline from one captured delivery. Standard Webhooks asks
// for 24 to 64 bytes; 16 is the floor we enforce so that keys from other senders still load.
const MIN_HMAC_BYTES = 16;
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;
// DER prefixes that wrap a raw 32-byte Ed25519 seed (PKCS#8) or public key (SPKI), so node:crypto
// can load the raw forms Standard Webhooks uses.
const PKCS8_ED25519 = Buffer.from('302e020100300506032b657004220420', 'hex');
const SPKI_ED25519 = Buffer.from('302a300506032b6570032100', 'hex');

const invalid = (detail: string, cause?: unknown) =>
  new WebhookError('secret_invalid', detail, cause === undefined ? {} : { cause });

function decodeBase64(text: string, what: string): Buffer {
  if (!BASE64.test(text) || text.length % 4 === 1) throw invalid(`The ${what} is not valid base64.`);
  return Buffer.from(text, 'base64');
}

function hmacKey(bytes: Uint8Array): ParsedSecret {
  if (bytes.length < MIN_HMAC_BYTES) {
    throw invalid(
      `A v1 webhook secret must be at least ${MIN_HMAC_BYTES} bytes (Standard Webhooks asks for 24 to 64).`,
    );
  }
  const key = Buffer.from(bytes);
  const compute = (content: Buffer) => createHmac('sha256', key).update(content).digest();
  const signer: SigningKey = { version: 'v1', sign: (content) => compute(content).toString('base64') };
  const checkerFor = (content: Buffer) => {
    let expected: Buffer | undefined;
    return (signature: Buffer) => {
      expected ??= compute(content);
      // Equal lengths first: timingSafeEqual throws otherwise, and a wrong length is simply "no match".
      if (signature.length !== expected.length) return false;
      return timingSafeEqual(expected, signature);
    };
  };
  return {
    version: 'v1',
    signer,
    verify: (content, signature) => checkerFor(content)(signature),
    checkerFor,
  };
}

// Ed25519 hashes the content with each signature's own first half, so there is nothing to share
// between entries: each one costs a pass over the body, which MAX_ENTRIES bounds.
function ed25519Key(publicKey: KeyObject): Pick<VerifyingKey, 'verify' | 'checkerFor'> {
  const check = (content: Buffer, signature: Buffer) => {
    if (signature.length !== 64) return false;
    try {
      return verify(null, content, publicKey, signature);
    } catch {
      return false;
    }
  };
  return { verify: check, checkerFor: (content) => (signature) => check(content, signature) };
}

function ed25519Private(bytes: Buffer): ParsedSecret {
  if (bytes.length !== 32 && bytes.length !== 64) {
    throw invalid('A whsk_ key must hold a 32-byte Ed25519 seed, or the seed followed by the 32-byte public key.');
  }
  let privateKey: KeyObject;
  try {
    privateKey = createPrivateKey({
      key: Buffer.concat([PKCS8_ED25519, bytes.subarray(0, 32)]),
      format: 'der',
      type: 'pkcs8',
    });
  } catch (cause) {
    throw invalid('The whsk_ key is not a valid Ed25519 private key.', cause);
  }
  const publicKey = createPublicKey(privateKey);
  if (bytes.length === 64) {
    const derived = publicKey.export({ format: 'der', type: 'spki' }).subarray(SPKI_ED25519.length);
    // A key whose second half is not its own public key was assembled wrongly; refuse it rather than
    // sign with a key the receivers' public key will never match.
    if (!derived.equals(bytes.subarray(32)))
      throw invalid('The whsk_ key holds a public half that does not match its seed.');
  }
  const signer: SigningKey = { version: 'v1a', sign: (content) => sign(null, content, privateKey).toString('base64') };
  return { version: 'v1a', signer, ...ed25519Key(publicKey) };
}

function ed25519Public(bytes: Buffer): ParsedSecret {
  if (bytes.length !== 32) throw invalid('A whpk_ key must hold a 32-byte Ed25519 public key.');
  let publicKey: KeyObject;
  try {
    publicKey = createPublicKey({ key: Buffer.concat([SPKI_ED25519, bytes]), format: 'der', type: 'spki' });
  } catch (cause) {
    throw invalid('The whpk_ key is not a valid Ed25519 public key.', cause);
  }
  return { version: 'v1a', signer: undefined, ...ed25519Key(publicKey) };
}

/**
 * Parses one webhook secret. Throws a {@link WebhookError} with code `secret_invalid` on an empty
 * secret, a bare prefix, bad base64, a too-short key, or surrounding whitespace (usually the newline of
 * an environment file, which would otherwise fail every delivery as "no matching signature").
 *
 * @example
 * const key = parseSecret('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
 * key.version; // 'v1'
 */
export function parseSecret(secret: WebhookSecret): ParsedSecret {
  if (secret instanceof Uint8Array) {
    // The bytes of a secret's text (a secret file read without an encoding) would load as a key no
    // sender uses, and every delivery would fail as "no matching signature". Random key bytes start
    // with one of these prefixes about once in 2^40.
    const head = Buffer.from(secret.buffer, secret.byteOffset, Math.min(secret.byteLength, 6)).toString('latin1');
    if (['whsec_', 'whsk_', 'whpk_'].some((prefix) => head.startsWith(prefix))) {
      throw invalid(
        'The webhook secret is the bytes of its text (a file read without an encoding?); pass the text, a string.',
      );
    }
    return hmacKey(secret);
  }
  if (typeof secret !== 'string') throw invalid('A webhook secret must be a string or a Uint8Array.');
  if (secret.length === 0) throw invalid('The webhook secret is empty.');
  if (secret.trim() !== secret) {
    throw invalid('The webhook secret has leading or trailing whitespace (often a newline from an env file); trim it.');
  }
  if (secret.startsWith('whsk_')) return ed25519Private(decodeBase64(secret.slice(5), 'whsk_ key'));
  if (secret.startsWith('whpk_')) return ed25519Public(decodeBase64(secret.slice(5), 'whpk_ key'));
  const body = secret.startsWith('whsec_') ? secret.slice(6) : secret;
  if (body.length === 0) throw invalid('The webhook secret is only a prefix, with no key after it.');
  return hmacKey(decodeBase64(body, 'webhook secret'));
}

/**
 * Parses one secret or a list (for rotation). An empty list throws `secret_invalid`.
 *
 * @example
 * const keys = parseSecrets(['whsec_new...', 'whsec_old...']);
 */
export function parseSecrets(secrets: WebhookSecret | readonly WebhookSecret[]): ParsedSecret[] {
  const list = Array.isArray(secrets) ? (secrets as readonly WebhookSecret[]) : [secrets as WebhookSecret];
  if (list.length === 0) throw invalid('At least one webhook secret is required.');
  return list.map(parseSecret);
}

/** What {@link generateSecret} returns. */
export type GeneratedSecret =
  | { version: 'v1'; secret: string }
  | { version: 'v1a'; privateKey: string; publicKey: string };

/**
 * Creates a fresh secret: 32 random bytes as `whsec_...` for `v1`, or an Ed25519 pair as
 * `whsk_...` (seed and public key, 64 bytes) and `whpk_...` for `v1a`.
 *
 * @example
 * const { secret } = generateSecret('v1') as { secret: string };
 * const pair = generateSecret('v1a'); // { privateKey: 'whsk_...', publicKey: 'whpk_...' }
 */
export function generateSecret(version: SignatureVersion = 'v1'): GeneratedSecret {
  if (version === 'v1') return { version, secret: `whsec_${randomBytes(32).toString('base64')}` };
  if (version !== 'v1a') throw new TypeError("version must be 'v1' or 'v1a'");
  const seed = randomBytes(32);
  const privateKey = createPrivateKey({ key: Buffer.concat([PKCS8_ED25519, seed]), format: 'der', type: 'pkcs8' });
  const publicBytes = createPublicKey(privateKey).export({ format: 'der', type: 'spki' }).subarray(SPKI_ED25519.length);
  return {
    version,
    privateKey: `whsk_${Buffer.concat([seed, publicBytes]).toString('base64')}`,
    publicKey: `whpk_${publicBytes.toString('base64')}`,
  };
}
