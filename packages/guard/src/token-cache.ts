import { createHash } from 'node:crypto';
import type { Principal } from './principal.js';

/** A cached verification: the principal and the configured issuer whose key verified it. */
export interface CachedPrincipal {
  readonly principal: Principal;
  readonly expiresAt: number;
  readonly issuer: string;
}

/** A bounded cache of verified tokens. `jkt` is the key of the DPoP proof a bound token came with. */
export interface TokenCache {
  get(token: string, jkt: string | undefined, nowMs: number): CachedPrincipal | undefined;
  /**
   * The issuer's eviction epoch: it changes each time {@link TokenCache.deleteIssuer} runs. A
   * verification reads it before its key lookup and hands it to `set`.
   */
  epoch(issuer: string): number;
  /** Stores a verified token, unless the issuer's entries were dropped since `epoch` was read. */
  set(
    token: string,
    jkt: string | undefined,
    principal: Principal,
    expiresAt: number,
    issuer: string,
    epoch: number,
  ): void;
  deleteIssuer(issuer: string): void;
  readonly size: number;
}

/**
 * The verified-token cache. Safe by construction (research section 10, item 10):
 * - the key is SHA-256 of the whole token, so two tokens never share an entry (fast-jwt
 *   CVE-2026-35039 came from a partial key) and no token is kept in memory;
 * - a DPoP-bound result lives in its own namespace, keyed by the token and the proof's key together:
 *   no token string, whatever it contains, hashes to the input of a bound entry, so a bound principal
 *   is only ever served to a request whose proof verified for that key;
 * - an entry dies at the token's `exp` (or its max-age limit), whichever is first, and is not served
 *   while its issuer's key set cannot be trusted (a remote set past stale-if-error): the token is then
 *   verified again, and fails as an uncached one would;
 * - only successes are stored: an error is never cached, so a key that appears later is used;
 * - it holds at most `maxEntries`; the oldest entry goes first;
 * - entries of an issuer are dropped when that issuer retires a key, and a verification that was
 *   already under way with the old keys (its lookup came before the refresh, its signature check
 *   ends after) does not put its result back: `set` is skipped when the issuer's epoch moved since
 *   the verification read it before its lookup.
 *
 * `keysUsable` tells whether the keys of a configured issuer may still be trusted at a time.
 *
 * @example
 * const cache = createTokenCache(10_000, (issuer) => issuers.get(issuer)?.keys.usable() ?? false);
 * const epoch = cache.epoch(principal.iss); // before the key lookup
 * cache.set(token, undefined, principal, principal.claims.exp * 1000, principal.iss, epoch);
 */
export function createTokenCache(
  maxEntries: number,
  keysUsable: (issuer: string, nowMs: number) => boolean,
): TokenCache {
  if (!Number.isSafeInteger(maxEntries) || maxEntries < 1)
    throw new TypeError('cache.maxEntries must be a positive integer');
  const entries = new Map<string, CachedPrincipal>();
  // Per issuer, how many times its entries were dropped. Only issuers that retired a key appear.
  const epochs = new Map<string, number>();
  // The hashed input starts with `b` (bearer) or `d` (DPoP): the two namespaces share no input, so
  // a bearer token never lands on a bound entry. A jkt is a base64url thumbprint computed here, never
  // sent, so it holds no `:` and the input `d:<jkt>:<token>` splits one way only.
  const hash = (token: string, jkt: string | undefined) =>
    (jkt === undefined ? createHash('sha256').update('b:') : createHash('sha256').update(`d:${jkt}:`))
      .update(token)
      .digest('base64url');
  return {
    get(token, jkt, nowMs) {
      const key = hash(token, jkt);
      const entry = entries.get(key);
      if (entry === undefined) return undefined;
      // Without trusted keys, the signature behind the entry vouches for nothing any more.
      if (nowMs >= entry.expiresAt || !keysUsable(entry.issuer, nowMs)) {
        entries.delete(key);
        return undefined;
      }
      return entry;
    },
    epoch(issuer) {
      return epochs.get(issuer) ?? 0;
    },
    set(token, jkt, principal, expiresAt, issuer, epoch) {
      // Verified with keys the issuer has retired since: the eviction already ran, and an entry
      // stored now would outlive it until `exp`, since a hit only asks whether the current set is fresh.
      if ((epochs.get(issuer) ?? 0) !== epoch) return;
      const key = hash(token, jkt);
      entries.delete(key);
      if (entries.size >= maxEntries) {
        const oldest = entries.keys().next();
        if (!oldest.done) entries.delete(oldest.value);
      }
      entries.set(key, { principal, expiresAt, issuer });
    },
    deleteIssuer(issuer) {
      epochs.set(issuer, (epochs.get(issuer) ?? 0) + 1);
      for (const [key, entry] of entries) if (entry.issuer === issuer) entries.delete(key);
    },
    get size() {
      return entries.size;
    },
  };
}
