import { errors, type KoaContextWithOIDC } from 'oidc-provider';

/**
 * Refuses, with `invalid_target`, a refresh that names a resource indicator (RFC 8707) its refresh
 * token was not granted for, before the token is rotated.
 *
 * Why here: oidc-provider consumes a rotating refresh token first and resolves the `resource` after.
 * A request refused for its resource then used the token up without handing out the new one, and the
 * client's next refresh, with the only token it holds, looked like reuse and revoked the whole grant
 * (RFC 9700 section 4.14.2 revokes on reuse; a refused request must not count as a use). The
 * `rotateRefreshToken` hook is the last step before the consume, with the token loaded, so the check
 * runs there and the hook answers "rotate" as before.
 *
 * `pickOne` is the provider's `defaultResource`: what it resolves several requested indicators to. With
 * no `resource` the granted one is used (`useGrantedResource`), which is always the token's own.
 *
 * @example
 * ```ts
 * rotateRefreshToken: (ctx) => {
 *   assertRefreshResource(ctx, (oneOf) => (oneOf ? apiResource : undefined));
 *   return true;
 * },
 * ```
 */
export function assertRefreshResource(
  ctx: KoaContextWithOIDC,
  pickOne: (oneOf: readonly string[]) => string | undefined,
): void {
  // The same steps as oidc-provider's own resolution after the consume, so both refuse the same requests.
  const requested = ctx.oidc.params?.resource;
  if (!requested) return;
  const resource = Array.isArray(requested) ? pickOne(requested.map(String)) : String(requested);
  if (resource === undefined) return;
  if (!ctx.oidc.entities.RefreshToken?.resourceIndicators.has(resource)) throw new errors.InvalidTarget();
}
