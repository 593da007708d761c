import { createHash } from 'node:crypto';
import type { Principal } from './principal.js';

interface Entry {
  principal: Principal;
  expiresAt: number;
  issuer: string;
}

/** A bounded cache of verified tokens. */
export interface TokenCache {
  get(token: string, nowMs: number): Principal | undefined;
  set(token: string, principal: Principal, expiresAt: number, issuer: string): void;
  deleteIssuer(issuer: string): void;
  readonly size: number;
}

/**
 * The verified-token cache. Safe by construction (research section 10, item 10):
 * - the key is SHA-256 of the whole token, so two tokens never share an entry (fast-jwt
 *   CVE-2026-35039 came from a partial key) and no token is kept in memory;
 * - an entry dies at the token's `exp` (or its max-age limit), whichever is first;
 * - only successes are stored: an error is never cached, so a key that appears later is used;
 * - it holds at most `maxEntries`; the oldest entry goes first;
 * - entries of an issuer are dropped when that issuer retires a key.
 *
 * @example
 * const cache = createTokenCache(10_000);
 * cache.set(token, principal, principal.claims.exp * 1000, principal.iss);
 */
export function createTokenCache(maxEntries: number): TokenCache {
  if (!Number.isSafeInteger(maxEntries) || maxEntries < 1)
    throw new TypeError('cache.maxEntries must be a positive integer');
  const entries = new Map<string, Entry>();
  const hash = (token: string) => createHash('sha256').update(token).digest('base64url');
  return {
    get(token, nowMs) {
      const key = hash(token);
      const entry = entries.get(key);
      if (entry === undefined) return undefined;
      if (nowMs >= entry.expiresAt) {
        entries.delete(key);
        return undefined;
      }
      return entry.principal;
    },
    set(token, principal, expiresAt, issuer) {
      const key = hash(token);
      entries.delete(key);
      if (entries.size >= maxEntries) {
        const oldest = entries.keys().next();
        if (!oldest.done) entries.delete(oldest.value);
      }
      entries.set(key, { principal, expiresAt, issuer });
    },
    deleteIssuer(issuer) {
      for (const [key, entry] of entries) if (entry.issuer === issuer) entries.delete(key);
    },
    get size() {
      return entries.size;
    },
  };
}
