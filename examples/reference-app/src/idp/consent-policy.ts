import { interactionPolicy, type KoaContextWithOIDC } from 'oidc-provider';

/** What the request asks for, as the consent prompt's details carry it (see {@link consentPolicy}). */
export interface RequestedScopes {
  /** The identity scopes asked for: those of the request's `scope` the provider knows. */
  requestedOIDCScope: string[];
  /** Per resource the request is for, the scopes of the request's `scope` that resource server knows. */
  requestedResourceScopes: Record<string, string[]>;
  /**
   * Of {@link RequestedScopes.requestedOIDCScope}, those the grant holds (`grant.getOIDCScope()`). Not
   * requested minus missing: oidc-provider counts a scope the grant refused as not missing either.
   */
  grantedOIDCScope: string[];
  /** Of {@link RequestedScopes.requestedResourceScopes}, per resource, those the grant holds. */
  grantedResourceScopes: Record<string, string[]>;
}

/**
 * Everything the request asks for, filtered as oidc-provider's own consent checks filter it
 * (`op_scopes_missing`, `rs_scopes_missing`): the identity scopes of the configuration, and per resource
 * the scopes its resource server knows. The checks then keep only what the grant lacks; this keeps all,
 * and says which of them the grant holds.
 */
function requestedScopes(ctx: KoaContextWithOIDC): RequestedScopes {
  const { oidc } = ctx;
  // The grant's scopes less those it refused (oidc-provider's getters take the refused ones out).
  const holds = (scopes: readonly string[], held: string | undefined) => {
    const granted = new Set(held?.split(' '));
    return scopes.filter((scope) => granted.has(scope));
  };
  const asked = [...oidc.requestParamScopes];
  const requestedResourceScopes: Record<string, string[]> = {};
  const grantedResourceScopes: Record<string, string[]> = {};
  for (const [indicator, server] of Object.entries(oidc.resourceServers ?? {})) {
    const scopes = asked.filter((scope) => server.scopes.has(scope));
    if (!scopes.length) continue;
    requestedResourceScopes[indicator] = scopes;
    grantedResourceScopes[indicator] = holds(scopes, oidc.grant?.getResourceScope(indicator));
  }
  const requestedOIDCScope = [...oidc.requestParamOIDCScopes];
  return {
    requestedOIDCScope,
    requestedResourceScopes,
    grantedOIDCScope: holds(requestedOIDCScope, oidc.grant?.getOIDCScope()),
    grantedResourceScopes,
  };
}

/**
 * oidc-provider's default interaction policy, its consent prompt's details carrying everything the
 * request asks for (`requestedOIDCScope`, `requestedResourceScopes`) and what of it the grant holds
 * (`grantedOIDCScope`, `grantedResourceScopes`) next to what the grant lacks (`missingOIDCScope`,
 * `missingResourceScopes`). The consent page lists all of it, marking what the grant holds already:
 * a re-consent (`prompt=consent` at a grant that holds everything) then shows what Allow lets the
 * client have, not an empty list.
 *
 * @example
 * ```ts
 * const configuration = { interactions: { policy: consentPolicy(), url } };
 * ```
 */
export function consentPolicy(): interactionPolicy.DefaultPolicy {
  const policy = interactionPolicy.base();
  const consent = policy.get('consent');
  // A later oidc-provider without this prompt would show consent pages with nothing on them.
  if (!consent) throw new Error("oidc-provider's interaction policy has no consent prompt");
  const ownDetails = consent.details;
  consent.details = async (ctx) => ({ ...(await ownDetails(ctx)), ...requestedScopes(ctx) });
  return policy;
}
