import type Provider from 'oidc-provider';
import { assertGrantedResource, type PickResource } from './granted-resource.js';

/** A grant handler as `Provider.registerGrantType` takes it. */
export type GrantHandler = Parameters<Provider['registerGrantType']>[1];

/**
 * Wraps oidc-provider's `authorization_code` grant handler: a redemption whose `resource` (RFC 8707)
 * the code was not granted for is refused with `invalid_target` before the handler runs, so the code
 * is left unused and the corrected retry redeems it.
 *
 * Why: the handler consumes the code and only then resolves the `resource`. A redemption refused for
 * its resource used the code up, and the corrected retry was a second redemption, which revokes the
 * whole grant (RFC 6749 section 4.1.2), signing the user out of every earlier sign-in of that browser
 * too. Unlike the refresh grant (`rotateRefreshToken`), no configuration hook runs between the
 * handler's checks and the consume, so the check runs ahead of the handler, inside the token endpoint:
 * the client is authenticated and the parameters are read and checked by then.
 *
 * Only a code the handler would get as far as consuming is checked: one that exists, belongs to the
 * client, is unexpired and unused. Any other is left to the handler, so a replayed code still revokes
 * its grant whatever `resource` comes with it. A request wrong in both its resource and its PKCE
 * verifier, redirect URI or DPoP proof now hears `invalid_target` where it heard `invalid_grant`; the
 * code is left unused either way.
 *
 * @example
 * ```ts
 * provider.registerGrantType('authorization_code', checkCodeResourceFirst(handler, pickOne), params, dupes);
 * ```
 */
export function checkCodeResourceFirst(handler: GrantHandler, pickOne: PickResource): GrantHandler {
  return async (ctx) => {
    const { provider, client, params } = ctx.oidc;
    const value = params.code;
    const code =
      typeof value === 'string' ? await provider.AuthorizationCode.find(value, { ignoreExpiration: true }) : undefined;
    // `isValid`: neither consumed nor expired.
    if (code?.isValid && code.clientId === client.clientId) {
      assertGrantedResource(ctx, code.resourceIndicators, pickOne);
    }
    await handler(ctx);
  };
}
