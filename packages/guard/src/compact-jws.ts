import { parseStrictJson } from './strict-json.js';

/**
 * Size limits applied before any base64 or JSON work.
 *
 * @example
 * const limits: TokenLimits = { maxTokenLength: 4096, maxHeaderLength: 1024, maxDepth: 8 };
 */
export interface TokenLimits {
  /** Longest accepted token, in characters (default 8192). */
  maxTokenLength: number;
  /** Longest accepted protected-header segment, in characters (default 2048). */
  maxHeaderLength: number;
  /** Deepest accepted JSON nesting in header and payload (default 16). */
  maxDepth: number;
}

/**
 * The defaults of {@link TokenLimits}.
 *
 * @example
 * createGuard({ ...options, limits: { ...defaultTokenLimits, maxTokenLength: 4096 } });
 */
export const defaultTokenLimits: TokenLimits = { maxTokenLength: 8192, maxHeaderLength: 2048, maxDepth: 16 };

/** A compact JWS split and decoded, signature not yet checked. */
export interface ParsedJws {
  /** The protected header, parsed strictly. */
  header: Record<string, unknown>;
  /** The decoded payload bytes (a JWT layer parses them as JSON). */
  payload: Uint8Array;
  /** What the signature covers: the header and payload segments as sent, joined by their `.`. */
  signingInput: string;
  /** The decoded signature bytes. */
  signature: Uint8Array<ArrayBuffer>;
}

/** Why a compact JWS was refused before any crypto. */
export type JwsParseFailure = 'too-large' | 'malformed';

const base64urlAlphabet = /^[A-Za-z0-9_-]*$/;
// `fatal` refuses invalid UTF-8 (RFC 8725 §3.7); `ignoreBOM` keeps a BOM so the JSON parser refuses it.
const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * Decodes canonical base64url only: no padding, no `+`/`/`, no whitespace, and no set bits in the
 * unused tail (two encodings of the same bytes would let an attacker vary a token without changing what
 * it says). Returns `undefined` for anything else.
 *
 * @example
 * decodeCanonicalBase64url('Zm9v'); // Uint8Array [102, 111, 111]
 */
export function decodeCanonicalBase64url(segment: string): Uint8Array<ArrayBuffer> | undefined {
  const tail = segment.length % 4;
  if (tail === 1 || !base64urlAlphabet.test(segment)) return undefined;
  // The last character of a 2- or 3-character tail carries 4 or 2 bits past the final byte; a
  // canonical encoder writes them as zero. Checking them here is the same rule as re-encoding the
  // decoded bytes and comparing, without the second encoding.
  if (tail !== 0 && (base64urlValue(segment.charCodeAt(segment.length - 1)) & (tail === 2 ? 0x0f : 0x03)) !== 0) {
    return undefined;
  }
  const bytes = Buffer.from(segment, 'base64url');
  return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength) as Uint8Array<ArrayBuffer>;
}

// The 6-bit value of a base64url character (the caller has checked the alphabet).
function base64urlValue(code: number): number {
  if (code >= 0x61) return code - 0x61 + 26; // a-z
  if (code >= 0x41) return code === 0x5f ? 63 : code - 0x41; // A-Z, _
  if (code >= 0x30) return code - 0x30 + 52; // 0-9
  return 62; // -
}

/**
 * Decodes UTF-8 strictly, `undefined` when the bytes are not valid UTF-8.
 *
 * @example
 * decodeUtf8Strict(new Uint8Array([0xff])); // undefined
 */
export function decodeUtf8Strict(bytes: Uint8Array): string | undefined {
  try {
    return utf8.decode(bytes);
  } catch {
    return undefined;
  }
}

/**
 * Splits a compact JWS and parses its protected header, refusing JWE (five parts), JSON serialization,
 * an empty header or signature, non-canonical base64url, invalid UTF-8 and non-object or duplicate-key headers.
 *
 * @example
 * const parsed = parseCompactJws(token, defaultTokenLimits);
 * if (parsed.ok) console.log(parsed.value.header.alg);
 */
export function parseCompactJws(
  token: string,
  limits: TokenLimits = defaultTokenLimits,
): { ok: true; value: ParsedJws } | { ok: false; reason: JwsParseFailure } {
  if (token.length > limits.maxTokenLength) return { ok: false, reason: 'too-large' };
  const first = token.indexOf('.');
  const second = first === -1 ? -1 : token.indexOf('.', first + 1);
  if (second === -1 || token.indexOf('.', second + 1) !== -1) return { ok: false, reason: 'malformed' };
  const headerSegment = token.slice(0, first);
  const payloadSegment = token.slice(first + 1, second);
  const signatureSegment = token.slice(second + 1);
  // An empty payload is a valid JWS (the JWT layer refuses it); an empty header or signature never is.
  if (headerSegment.length === 0 || signatureSegment.length === 0) return { ok: false, reason: 'malformed' };
  if (headerSegment.length > limits.maxHeaderLength) return { ok: false, reason: 'too-large' };
  const headerBytes = decodeCanonicalBase64url(headerSegment);
  const payload = decodeCanonicalBase64url(payloadSegment);
  const signature = decodeCanonicalBase64url(signatureSegment);
  if (headerBytes === undefined || payload === undefined || signature === undefined) {
    return { ok: false, reason: 'malformed' };
  }
  const headerText = decodeUtf8Strict(headerBytes);
  if (headerText === undefined) return { ok: false, reason: 'malformed' };
  const header = parseStrictJson(headerText, limits.maxDepth);
  if (!header.ok || !isPlainObject(header.value)) return { ok: false, reason: 'malformed' };
  return { ok: true, value: { header: header.value, payload, signingInput: token.slice(0, second), signature } };
}

/**
 * True for a JSON object (not an array, not null).
 *
 * @example
 * isPlainObject([]); // false
 */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
