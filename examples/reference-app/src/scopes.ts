/**
 * The scopes an access token for the API (the gateway's audience, the receiver's admin API included)
 * can carry. Reads and writes are separate scopes, so a client asks for exactly what it uses (spec 5.7).
 */
export const apiScopes = [
  'photos:read',
  'photos:write',
  'stock:read',
  'stock:write',
  'charges:write',
  'settings:read',
  'settings:write',
  'events:read',
  'events:write',
] as const;

/** One scope of {@link apiScopes}. */
export type ApiScope = (typeof apiScopes)[number];

/**
 * The scopes of administrators' actions: `PUT /stock/<id>` (`stock:write`) and the receiver's admin API
 * (`events:read`, `events:write`). Their routes require the scope and the `admin` role together, so a
 * delegated token acts with the user's role only where the user consented to that; and only tokens
 * carrying one of these scopes carry the user's `roles` at all.
 */
export const roleScopes: readonly ApiScope[] = ['stock:write', 'events:read', 'events:write'];

/**
 * True when the space-separated `scope` names at least one of {@link apiScopes}.
 *
 * @example
 * ```ts
 * asksForApiScope('openid profile'); // false
 * asksForApiScope('openid photos:read'); // true
 * ```
 */
export function asksForApiScope(scope: unknown): boolean {
  return typeof scope === 'string' && scope.split(' ').some((name) => (apiScopes as readonly string[]).includes(name));
}

/**
 * True when the space-separated `scope` names at least one of {@link roleScopes}.
 *
 * @example
 * ```ts
 * carriesRoleScope('photos:read charges:write'); // false
 * carriesRoleScope('stock:write'); // true
 * ```
 */
export function carriesRoleScope(scope: unknown): boolean {
  return typeof scope === 'string' && scope.split(' ').some((name) => (roleScopes as readonly string[]).includes(name));
}
