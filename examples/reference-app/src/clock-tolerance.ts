/**
 * The clock skew, in seconds, the app allows when it checks an access token's `exp` and `nbf`: the
 * gateway (the guard's default, stated here) and the provider's introspection of its JWTs alike, so the
 * two never disagree on whether a token is still alive.
 *
 * @example
 * ```ts
 * createGuard({ audience, issuers, clockTolerance: accessTokenClockTolerance });
 * ```
 */
export const accessTokenClockTolerance = 5;
