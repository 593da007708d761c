import { assertScopeToken, GuardError, type GuardErrorOptions } from './errors.js';
import type { GuardRequest } from './extract-token.js';
import type { Principal } from './principal.js';
import { seconds } from './seconds.js';

/**
 * One authorization rule. Build them with {@link requireScopes}, {@link requireRoles}, {@link policy}.
 *
 * @example
 * const rules: Requirement[] = [requireScopes('orders:write'), requireRoles('clerk')];
 */
export type Requirement =
  | { readonly kind: 'scopes'; readonly scopes: readonly string[] }
  | { readonly kind: 'roles'; readonly roles: readonly string[]; readonly match: 'all' | 'any' }
  | { readonly kind: 'policy'; readonly check: (principal: Principal, request: GuardRequest) => boolean }
  | {
      readonly kind: 'authentication';
      readonly acrValues: readonly string[] | undefined;
      readonly maxAge: number | undefined;
    };

/**
 * The outcome of {@link authorizeRequest}.
 *
 * @example
 * const decision: AuthorizationResult = authorizeRequest(principal, rules, request);
 */
export type AuthorizationResult = { ok: true } | { ok: false; error: GuardError };

/**
 * Requires every listed scope. A refusal names them in the challenge:
 * `Bearer realm="api", error="insufficient_scope", ..., scope="orders:write"`.
 *
 * @example
 * const canWrite = requireScopes('orders:write');
 */
export function requireScopes(...scopes: string[]): Requirement {
  if (scopes.length === 0) throw new TypeError('requireScopes needs at least one scope');
  for (const scope of scopes) assertScopeToken(scope, 'requireScopes');
  return Object.freeze({ kind: 'scopes', scopes: Object.freeze([...scopes]) });
}

/**
 * Requires every listed role (from the `roles` claim, or the guard's `rolesClaim`).
 *
 * @example
 * const adminOnly = requireRoles('admin');
 */
export function requireRoles(...roles: string[]): Requirement {
  if (roles.length === 0) throw new TypeError('requireRoles needs at least one role');
  return Object.freeze({ kind: 'roles', roles: Object.freeze([...roles]), match: 'all' });
}

/**
 * Requires at least one of the listed roles.
 *
 * @example
 * const editors = requireAnyRole('editor', 'admin');
 */
export function requireAnyRole(...roles: string[]): Requirement {
  if (roles.length === 0) throw new TypeError('requireAnyRole needs at least one role');
  return Object.freeze({ kind: 'roles', roles: Object.freeze([...roles]), match: 'any' });
}

/**
 * An attribute policy: any predicate over the principal and the request. A predicate that throws
 * counts as a refusal (fail closed).
 *
 * @example
 * const ownTenant = policy((principal, request) => request.url?.startsWith(`/tenants/${principal.claims.tenant}/`) === true);
 */
export function policy(check: (principal: Principal, request: GuardRequest) => boolean): Requirement {
  if (typeof check !== 'function') throw new TypeError('policy needs a function');
  return Object.freeze({ kind: 'policy', check });
}

/**
 * Requires a strong or recent enough user authentication (RFC 9470): the token's `acr` must be one of
 * `acrValues`, and/or its `auth_time` at most `maxAge` seconds old, and not later than now, each give
 * or take the clock tolerance (as for `iat`: a login in the future is no recent login). A refusal is 401
 * `insufficient_user_authentication` with `acr_values` / `max_age` in the challenge, so the client can
 * send the user through a step-up login. No anchor sends this challenge (research section 10, item 6).
 *
 * @example
 * const recentMfa = requireAuthentication({ acrValues: ['urn:example:mfa'], maxAge: 300 });
 */
export function requireAuthentication(options: {
  acrValues?: readonly string[] | undefined;
  maxAge?: number | undefined;
}): Requirement {
  const { acrValues, maxAge } = options ?? {};
  if (acrValues === undefined && maxAge === undefined)
    throw new TypeError('requireAuthentication needs acrValues or maxAge');
  if (acrValues !== undefined) {
    if (acrValues.length === 0) throw new TypeError('acrValues must not be empty');
    for (const value of acrValues) assertScopeToken(value, 'acrValues');
  }
  if (maxAge !== undefined && (!Number.isSafeInteger(maxAge) || maxAge < 0)) {
    throw new TypeError('maxAge must be a whole number of seconds');
  }
  return Object.freeze({
    kind: 'authentication',
    acrValues: acrValues === undefined ? undefined : Object.freeze([...acrValues]),
    maxAge,
  });
}

/**
 * Options of {@link authorizeRequest}: the clock, and what every challenge carries (a guard passes
 * its own realm, RFC 9728 `resourceMetadata` and DPoP settings, so its refusals match its 401s).
 *
 * @example
 * const options: AuthorizeOptions = { realm: 'orders', resourceMetadata: 'https://api.example/.well-known/oauth-protected-resource' };
 */
export interface AuthorizeOptions
  extends Pick<GuardErrorOptions, 'realm' | 'resourceMetadata' | 'dpopAlgorithms' | 'dpopOnly'> {
  /** Clock in epoch milliseconds for `maxAge` checks (default `Date.now`). */
  now?: (() => number) | undefined;
  /**
   * Seconds an `auth_time` may lie ahead of `now`, or beyond `maxAge` behind it, for `maxAge` checks (default 5, at most 60): the
   * guard's `clockTolerance` for `exp`, `nbf` and `iat`. A guard passes its token issuer's own.
   */
  clockTolerance?: number | undefined;
}

/**
 * Checks every requirement in order. The first failing one gives a 403 `insufficient_scope`
 * (RFC 6750 §3.1) whose challenge lists the scopes of that requirement when it is a scope rule; a
 * role or attribute refusal is the same 403 without a `scope` attribute. Never 401: the caller is
 * authenticated (Oathkeeper #387). The exception is {@link requireAuthentication}: a login that is too
 * weak or too old is 401 `insufficient_user_authentication` (RFC 9470). Both carry `resource_metadata`
 * when `resourceMetadata` is given, and the step-up 401 offers DPoP beside Bearer when `dpopAlgorithms` is.
 *
 * @example
 * const decision = authorizeRequest(principal, [requireScopes('orders:write')], { headers: {} });
 * if (!decision.ok) console.log(decision.error.wwwAuthenticate);
 */
export function authorizeRequest(
  principal: Principal,
  requirements: readonly Requirement[],
  request: GuardRequest,
  options: AuthorizeOptions = {},
): AuthorizationResult {
  const { now, clockTolerance, ...errorOptions } = options;
  // Checked even when no rule reads it, so a bad value fails on the first call, not the first step-up.
  const tolerance = seconds(clockTolerance ?? 5, 'clockTolerance', { max: 60 });
  for (const requirement of requirements) {
    if (requirement.kind === 'authentication') {
      const { acr, auth_time: authTime } = principal.claims;
      const acrOk =
        requirement.acrValues === undefined || (typeof acr === 'string' && requirement.acrValues.includes(acr));
      const nowSeconds = (now ?? Date.now)() / 1000;
      // A login time ahead of the clock beyond the tolerance is no recent login: with `now - auth_time`
      // negative, an issuer writing milliseconds (or a forged far-future time) passed every maxAge forever.
      // The issuer's clock may be behind ours as much as ahead, so the age gets the same tolerance, as
      // OIDC clients give it (oauth4webapi, openid-client: auth_time + max_age < now - tolerance).
      const ageOk =
        requirement.maxAge === undefined ||
        (typeof authTime === 'number' &&
          Number.isSafeInteger(authTime) &&
          nowSeconds - authTime <= requirement.maxAge + tolerance &&
          authTime - nowSeconds <= tolerance);
      if (!acrOk || !ageOk) {
        return {
          ok: false,
          error: new GuardError('insufficient_user_authentication', {
            ...errorOptions,
            ...(requirement.acrValues === undefined ? {} : { acrValues: requirement.acrValues }),
            ...(requirement.maxAge === undefined ? {} : { maxAge: requirement.maxAge }),
          }),
        };
      }
      continue;
    }
    if (requirement.kind === 'scopes') {
      if (!requirement.scopes.every((scope) => principal.scope.has(scope))) {
        return {
          ok: false,
          error: new GuardError('insufficient_scope', { ...errorOptions, scope: requirement.scopes }),
        };
      }
    } else if (requirement.kind === 'roles') {
      const has = (role: string) => principal.roles.has(role);
      const allowed = requirement.match === 'all' ? requirement.roles.every(has) : requirement.roles.some(has);
      if (!allowed) return { ok: false, error: new GuardError('insufficient_scope', errorOptions) };
    } else {
      let allowed = false;
      try {
        allowed = requirement.check(principal, request) === true;
      } catch {
        allowed = false;
      }
      if (!allowed) return { ok: false, error: new GuardError('insufficient_scope', errorOptions) };
    }
  }
  return { ok: true };
}
