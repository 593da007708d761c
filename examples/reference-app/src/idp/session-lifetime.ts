/**
 * How long the provider's sign-in session lives after the password was given, however often it is
 * used: 14 days, in seconds. oidc-provider saves the session with its whole `ttl.Session` on each visit
 * that reads it (any app's "Sign in"), so a fixed TTL slides: a browser that came back within it each
 * time would never be asked for the password again (OWASP ASVS 3.3.2).
 */
export const sessionLifetimeSeconds = 14 * 24 * 3600;

/**
 * The `ttl.Session` of the provider: what is left of the session's lifetime, counted from its
 * `loginTs` (epoch seconds, set by the provider when the password was given, stored server-side), and
 * at least 1, which oidc-provider requires; the whole lifetime for a session nobody signed in to yet.
 * A session past its lifetime is not read at all (the adapter's `find`), so the 1 second is never used
 * to sign anyone in.
 *
 * @example
 * ```ts
 * sessionTtl(undefined, now); // 1209600
 * sessionTtl(now - 13 * 86_400, now); // 86400
 * ```
 */
export function sessionTtl(loginTs: unknown, nowSeconds: number): number {
  if (typeof loginTs !== 'number' || !Number.isFinite(loginTs)) return sessionLifetimeSeconds;
  return Math.max(1, Math.min(sessionLifetimeSeconds, Math.floor(loginTs + sessionLifetimeSeconds - nowSeconds)));
}
