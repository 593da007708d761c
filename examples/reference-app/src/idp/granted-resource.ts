import { errors, type KoaContextWithOIDC } from 'oidc-provider';

/** What the provider's `defaultResource` resolves several requested resource indicators to. */
export type PickResource = (ctx: KoaContextWithOIDC, oneOf: readonly string[]) => string | undefined;

/**
 * Throws `invalid_target` when the request's `resource` (RFC 8707) resolves to an indicator that is not
 * in `granted`, the indicators of the code or refresh token it presents.
 *
 * The same steps as oidc-provider's own resolution at the token endpoint, which runs only after it has
 * consumed the code or rotated the refresh token: run first, this refuses exactly the requests it would
 * refuse for their resource, while the code or token is still unused. With no `resource` the granted one
 * is used (`useGrantedResource`), which is always in `granted`; several are resolved by `pickOne`, the
 * provider's `defaultResource`.
 *
 * @example
 * ```ts
 * assertGrantedResource(ctx, ctx.oidc.entities.RefreshToken?.resourceIndicators, (_ctx, oneOf) => oneOf[0]);
 * ```
 */
export function assertGrantedResource(
  ctx: KoaContextWithOIDC,
  granted: ReadonlySet<string | undefined> | undefined,
  pickOne: PickResource,
): void {
  const requested = ctx.oidc.params?.resource;
  if (!requested) return;
  const resource = Array.isArray(requested) ? pickOne(ctx, requested.map(String)) : String(requested);
  if (resource === undefined) return;
  if (!granted?.has(resource)) throw new errors.InvalidTarget();
}

/**
 * Refuses, with `invalid_target`, a refresh that names a resource indicator its refresh token was not
 * granted for, before the token is rotated.
 *
 * Why here: oidc-provider consumes a rotating refresh token first and resolves the `resource` after.
 * A request refused for its resource then used the token up without handing out the new one, and the
 * client's next refresh, with the only token it holds, looked like reuse and revoked the whole grant
 * (RFC 9700 section 4.14.2 revokes on reuse; a refused request must not count as a use). The
 * `rotateRefreshToken` hook is the last step before the consume, with the token loaded, so the check
 * runs there and the hook answers "rotate" as before.
 *
 * @example
 * ```ts
 * rotateRefreshToken: (ctx) => {
 *   assertRefreshResource(ctx, (_ctx, oneOf) => (oneOf.length ? apiResource : undefined));
 *   return true;
 * },
 * ```
 */
export function assertRefreshResource(ctx: KoaContextWithOIDC, pickOne: PickResource): void {
  assertGrantedResource(ctx, ctx.oidc.entities.RefreshToken?.resourceIndicators, pickOne);
}
