/**
 * How long the provider's sign-in session lives after the password was given, however often it is
 * used, in seconds. A module of its own, free of oidc-provider, so `main.ts` can check
 * SESSION_LIFETIME_SECONDS before it loads the provider.
 *
 * oidc-provider saves the session with its whole `ttl.Session` on each visit that reads it (any app's
 * "Sign in"), so a fixed TTL slides: a browser that came back within it each time would never be asked
 * for the password again. OWASP ASVS 4.0.3 3.3.2 asks for the password again at least every 30 days at
 * level 1 and every 12 hours at level 2, however the session is used, and, at level 2, after 30
 * minutes idle too: the TTL is then the idle limit, or what is left of the lifetime when less.
 */

import { wholeSeconds } from './whole-seconds.js';

/** The default: 12 hours, ASVS 3.3.2 at level 2. */
export const defaultSessionLifetimeSeconds = 12 * 3600;

/** The longest that may be set: 30 days, what ASVS 3.3.2 allows at level 1. */
export const maxSessionLifetimeSeconds = 30 * 24 * 3600;

/**
 * The lifetime `value` (seconds), or the default when it is undefined; anything but a whole number
 * from 1 to {@link maxSessionLifetimeSeconds} is a `TypeError`.
 *
 * @example
 * ```ts
 * sessionLifetime(undefined); // 43200
 * sessionLifetime(14 * 86_400); // 1209600
 * ```
 */
export function sessionLifetime(value: number | undefined): number {
  return wholeSeconds(value ?? defaultSessionLifetimeSeconds, 'sessionLifetimeSeconds', 1, maxSessionLifetimeSeconds);
}

/** The default idle limit: 30 minutes without a visit, ASVS 3.3.2 at level 2. */
export const defaultSessionIdleSeconds = 30 * 60;

/**
 * The shortest idle limit that may be set: a minute. The app records a session's use at most once a
 * minute (`app/sessions.ts`), so a shorter limit would end sessions in use.
 */
export const minSessionIdleSeconds = 60;

/**
 * The idle limits that may be set next to a session lifetime (`undefined`: the default one): from
 * {@link minSessionIdleSeconds} to the lifetime, as `npm start` reads SESSION_IDLE_SECONDS.
 *
 * @example
 * ```ts
 * sessionIdleBounds(undefined); // { min: 60, max: 43200 }
 * ```
 */
export function sessionIdleBounds(lifetimeSeconds: number | undefined): { min: number; max: number } {
  return { min: minSessionIdleSeconds, max: lifetimeSeconds ?? defaultSessionLifetimeSeconds };
}

/**
 * The idle limit `value` (seconds), or the default when it is undefined (30 minutes, or
 * `lifetimeSeconds` when shorter); anything but a whole number from {@link minSessionIdleSeconds} to
 * `lifetimeSeconds` is a `TypeError`: a limit past the lifetime would never be reached.
 *
 * @example
 * ```ts
 * sessionIdle(undefined, 43_200); // 1800
 * sessionIdle(900, 43_200); // 900
 * ```
 */
export function sessionIdle(value: number | undefined, lifetimeSeconds: number): number {
  if (value === undefined) return Math.min(defaultSessionIdleSeconds, lifetimeSeconds);
  return wholeSeconds(
    value,
    'sessionIdleSeconds',
    minSessionIdleSeconds,
    lifetimeSeconds,
    `the session lifetime (${lifetimeSeconds})`,
  );
}

/**
 * The `ttl.Session` of the provider: `idleSeconds`, or what is left of the session's lifetime when
 * that is less, counted from its `loginTs` (epoch seconds, set by the provider when the password was
 * given, stored server-side), and at least 1, which oidc-provider requires. oidc-provider saves the
 * session with this TTL at each visit that reads it, so the row (whose expiry the database's clock
 * counts) ends `idleSeconds` after the last visit, or at the end of the lifetime, whichever is first.
 * A session past its lifetime is not read at all (the adapter's `find`), so the 1 second is never used
 * to sign anyone in.
 *
 * @example
 * ```ts
 * sessionTtl(undefined, now, 43_200, 1800); // 1800
 * sessionTtl(now - 11 * 3600, now, 43_200); // 3600
 * sessionTtl(now - 11.9 * 3600, now, 43_200, 1800); // 360
 * ```
 */
export function sessionTtl(
  loginTs: unknown,
  nowSeconds: number,
  lifetimeSeconds: number,
  idleSeconds = lifetimeSeconds,
): number {
  const most = Math.min(idleSeconds, lifetimeSeconds);
  if (typeof loginTs !== 'number' || !Number.isFinite(loginTs)) return most;
  return Math.max(1, Math.min(most, Math.floor(loginTs + lifetimeSeconds - nowSeconds)));
}
