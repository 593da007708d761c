import { readonlyStringSet } from './readonly-set.js';

/**
 * Who the caller is, as the guard established it. Immutable, all the way down: the verified-token
 * cache hands the same principal to every request with that token, so a change made while handling
 * one request would reach the next. `scope` and `roles` are read-only sets (no `add`, `delete` or
 * `clear`) so a check reads `principal.scope.has('orders:write')` whatever the issuer's claim shape
 * was; `claims` and everything in it are frozen. To enrich a principal, copy it.
 *
 * @example
 * if (principal.scope.has('orders:write') && principal.roles.has('clerk')) allow();
 */
export interface Principal {
  readonly sub: string;
  /** The issuer of the caller's token (behind the gateway: the original issuer, not the gateway). */
  readonly iss: string;
  readonly aud: readonly string[];
  readonly scope: ReadonlySet<string>;
  readonly roles: ReadonlySet<string>;
  /** The client the token was issued to: `client_id`, else `azp` (see {@link principalFromClaims}). */
  readonly clientId: string | undefined;
  readonly jti: string | undefined;
  /** Every claim of the verified token (frozen, nested objects and arrays too). */
  readonly claims: Readonly<Record<string, unknown>>;
}

// The client the token was issued to: RFC 9068's `client_id`, else OpenID Connect's authorized party
// `azp`, where Auth0, Keycloak and Entra (v2) name it in their access tokens. Provider-specific names
// (Okta's `cid`, Entra v1's `appid`) stay in `claims`: read by name, one issuer's claim could mean
// something else in another's tokens.
function clientOf(claims: Record<string, unknown>): string | undefined {
  if (typeof claims.client_id === 'string') return claims.client_id;
  return typeof claims.azp === 'string' ? claims.azp : undefined;
}

// Frozen copies of JSON values: plain objects and arrays are copied, then frozen, at every level.
// Copied rather than frozen in place so a caller's own objects passed to principalFromClaims stay
// theirs. Other objects (only a caller can pass them; a token holds JSON) are kept as they are.
function frozenRecord(value: object): Readonly<Record<string, unknown>> {
  // fromEntries defines members rather than assigning them: a `__proto__` member stays a plain member.
  return Object.freeze(Object.fromEntries(Object.entries(value).map(([key, member]) => [key, frozenCopy(member)])));
}

function frozenCopy(value: unknown): unknown {
  if (typeof value !== 'object' || value === null) return value;
  if (Array.isArray(value)) return Object.freeze(value.map(frozenCopy));
  const prototype = Object.getPrototypeOf(value);
  return prototype === Object.prototype || prototype === null ? frozenRecord(value) : value;
}

// `split` is for the scope claims only: OAuth `scope` is space-delimited by definition (RFC 6749 §3.3,
// RFC 9068), and so is a string `scp`. A role or group is a name that may hold a space
// (`"Finance Admin"`): a string roles claim is one role, or that group would pass requireRoles('Admin').
function addWords(target: Set<string>, value: unknown, split: boolean): void {
  if (typeof value === 'string') {
    if (!split) {
      if (value.length > 0) target.add(value);
      return;
    }
    for (const word of value.split(' ')) if (word.length > 0) target.add(word);
  } else if (Array.isArray(value)) {
    for (const item of value) if (typeof item === 'string' && item.length > 0) target.add(item);
  }
}

// The claim a name or a path of member names leads to: own members of plain objects only, so no path
// reaches `__proto__` or `constructor` of a claim's prototype.
function claimAt(claims: Record<string, unknown>, path: string | readonly string[]): unknown {
  if (typeof path === 'string') return Object.hasOwn(claims, path) ? claims[path] : undefined;
  let value: unknown = claims;
  for (const name of path) {
    if (value === null || typeof value !== 'object' || Array.isArray(value) || !Object.hasOwn(value, name)) {
      return undefined;
    }
    value = (value as Record<string, unknown>)[name];
  }
  return value;
}

/**
 * True when a claim is a string or an array of strings (the shapes scope and role claims may take).
 *
 * @example
 * isWordList(['a', 'b']); // true
 */
export function isWordList(value: unknown): boolean {
  return typeof value === 'string' || (Array.isArray(value) && value.every((item) => typeof item === 'string'));
}

/**
 * Builds a principal from verified claims. Scopes come from `scope` (space-delimited, RFC 9068) and
 * `scp` (string or array, as some issuers send), so both shapes give the same decision (research case
 * 49). Roles come from the configured claim (default `roles`): an array of names, or one string that
 * is one role (never split on spaces, unlike `scope`). The audience comes from `aud`, or from the
 * issuer's `audienceClaim`.
 *
 * @example
 * const principal = principalFromClaims({ sub: 'u1', iss: 'https://id.example', aud: 'api', scope: 'a b' });
 * principal.scope.has('a'); // true
 */
export function principalFromClaims(
  claims: Record<string, unknown>,
  options: {
    rolesClaim?: string | readonly string[] | undefined;
    audienceClaim?: string | undefined;
    issuer?: string | undefined;
    audience?: readonly string[] | undefined;
  } = {},
): Principal {
  const scope = new Set<string>();
  addWords(scope, claims.scope, true);
  addWords(scope, claims.scp, true);
  const roles = new Set<string>();
  addWords(roles, claimAt(claims, options.rolesClaim ?? 'roles'), false);
  // `aud`, or the claim an issuer names its audience in (Cognito's `client_id`), already checked.
  const named = claims[options.audienceClaim ?? 'aud'];
  const aud = options.audience ?? (typeof named === 'string' ? [named] : ((named as string[] | undefined) ?? []));
  return Object.freeze({
    sub: claims.sub as string,
    iss: options.issuer ?? (claims.iss as string),
    aud: Object.freeze([...aud]),
    scope: readonlyStringSet(scope),
    roles: readonlyStringSet(roles),
    clientId: clientOf(claims),
    jti: typeof claims.jti === 'string' ? claims.jti : undefined,
    claims: frozenRecord(claims),
  });
}
