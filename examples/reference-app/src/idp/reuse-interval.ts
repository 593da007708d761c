/**
 * The bounds of the refresh token reuse interval (`adapter.ts`), in seconds. A module of their own, free
 * of oidc-provider, so `main.ts` can check REFRESH_TOKEN_REUSE_SECONDS before it loads the provider.
 */

import { wholeSeconds } from './whole-seconds.js';

/** The reuse interval of a rotated refresh token when none is given. */
export const defaultRefreshTokenReuseSeconds = 30;

/**
 * The longest: 14 days, the refresh token's lifetime (`tokenLifetimes` in `provider.ts`). The database
 * computes `now() - interval`, which is out of a timestamp's range for an interval of millions of
 * years (every refresh a 500), and no refresh token lives longer anyway.
 */
export const maxRefreshTokenReuseSeconds = 14 * 24 * 3600;

/**
 * The reuse interval `value` (seconds), or the default when it is undefined; anything but a whole
 * number from 0 to {@link maxRefreshTokenReuseSeconds} is a `TypeError`.
 *
 * @example
 * const reuseSeconds = refreshTokenReuse(options.refreshTokenReuseSeconds);
 */
export function refreshTokenReuse(value: number | undefined): number {
  return wholeSeconds(
    value ?? defaultRefreshTokenReuseSeconds,
    'refreshTokenReuseSeconds',
    0,
    maxRefreshTokenReuseSeconds,
  );
}
