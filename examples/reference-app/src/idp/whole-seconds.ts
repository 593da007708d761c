/**
 * `seconds` when it is a whole number from `min` to `max`; otherwise a `TypeError` naming the option
 * `name` and the range (`maxSaid` says the upper bound in words when it is another option's value).
 * The duration options of `createIdp` and the app (lifetimes, idle limits, reuse intervals) are
 * checked alike: a fraction, NaN or a value out of range would reach oidc-provider's TTLs or the
 * database's intervals, and fail there per request instead of at start.
 *
 * @example
 * ```ts
 * wholeSeconds(30, 'refreshTokenReuseSeconds', 0, 1_209_600); // 30
 * ```
 */
export function wholeSeconds(seconds: number, name: string, min: number, max: number, maxSaid = String(max)): number {
  if (!Number.isSafeInteger(seconds) || seconds < min || seconds > max) {
    throw new TypeError(`${name} must be a whole number of seconds from ${min} to ${maxSaid}`);
  }
  return seconds;
}
