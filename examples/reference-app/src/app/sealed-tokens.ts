import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';
import type { SessionTokens } from './session-values.js';

/**
 * A session's tokens as its row keeps them: AES-256-GCM under a key only the session id opens
 * ({@link sealTokens}). Each field base64url.
 */
export interface SealedTokens {
  v: 1;
  iv: string;
  ct: string;
}

/**
 * The HKDF label of the key: a key derived from a session id for anything else (or a later version
 * of this one) gets its own label, so no key ever serves two uses.
 */
const label = 'idem reference app session tokens v1';

/** GCM's tag, appended to the ciphertext in `ct`: 16 bytes, the full tag (never truncated). */
const tagBytes = 16;

/**
 * The key of session `id`. The id is 256 random bits, so HKDF needs no salt to make it a uniform key
 * (RFC 5869 3.1); a slow hash would buy nothing against a guess of 2^256.
 */
const keyOf = (id: string) => Buffer.from(hkdfSync('sha256', id, Buffer.alloc(0), label, 32));

/**
 * What the ciphertext is bound to: its row (`idHash`, the stored hash of the id) and the format. The
 * key alone already differs per session; the row in the AAD says so in the format itself, so a seal
 * copied to another row fails even if two rows ever shared a key.
 */
const aadOf = (idHash: string) => Buffer.from(`${label}\n${idHash}`);

/**
 * Seals `tokens` for the row of session `id` (whose stored hash is `idHash`): the row alone, without
 * the id the browser's cookie holds, tells nothing of them. A fresh random IV each time: a key is
 * used for every refresh of its session, and a repeated GCM nonce would give its key stream away.
 *
 * @example
 * ```ts
 * const sealed = sealTokens(id, sha256Id(id), { accessToken, refreshToken, expiresAt });
 * openTokens(id, sha256Id(id), sealed); // the same tokens
 * ```
 */
export function sealTokens(id: string, idHash: string, tokens: SessionTokens): SealedTokens {
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', keyOf(id), iv, { authTagLength: tagBytes });
  cipher.setAAD(aadOf(idHash));
  const ct = Buffer.concat([cipher.update(JSON.stringify(tokens), 'utf8'), cipher.final(), cipher.getAuthTag()]);
  return { v: 1, iv: iv.toString('base64url'), ct: ct.toString('base64url') };
}

/**
 * The tokens {@link sealTokens} sealed for session `id`, or undefined when the seal does not open: of
 * another row, altered, not of this format, or not JSON tokens. Never throws: whatever is in the row,
 * the caller treats a seal that does not open as a session that is over.
 *
 * @example
 * ```ts
 * const tokens = openTokens(id, sha256Id(id), row.data.sealed);
 * if (!tokens) signOut();
 * ```
 */
export function openTokens(id: string, idHash: string, sealed: unknown): SessionTokens | undefined {
  if (!isSealed(sealed)) return undefined;
  try {
    const iv = Buffer.from(sealed.iv, 'base64url');
    const ct = Buffer.from(sealed.ct, 'base64url');
    if (iv.length !== 12 || ct.length < tagBytes) return undefined;
    const decipher = createDecipheriv('aes-256-gcm', keyOf(id), iv, { authTagLength: tagBytes });
    decipher.setAAD(aadOf(idHash));
    decipher.setAuthTag(ct.subarray(ct.length - tagBytes));
    const text = Buffer.concat([decipher.update(ct.subarray(0, ct.length - tagBytes)), decipher.final()]);
    const tokens: unknown = JSON.parse(text.toString('utf8'));
    return isTokens(tokens) ? tokens : undefined;
  } catch {
    // The tag did not match (another row's seal, a changed byte, another key): nothing is told of why.
    return undefined;
  }
}

/** Whether `value` has the shape of a {@link SealedTokens} of this version. */
export function isSealed(value: unknown): value is SealedTokens {
  if (typeof value !== 'object' || value === null) return false;
  const { v, iv, ct } = value as Record<string, unknown>;
  return v === 1 && typeof iv === 'string' && typeof ct === 'string';
}

/** Only what this version sealed opens to this: checked all the same, the row is outside data. */
const isTokens = (value: unknown): value is SessionTokens =>
  typeof value === 'object' &&
  value !== null &&
  typeof (value as SessionTokens).accessToken === 'string' &&
  typeof (value as SessionTokens).expiresAt === 'number';
