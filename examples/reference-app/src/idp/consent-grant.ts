import type { Grant } from 'oidc-provider';

/**
 * What an Allow adds to the grant: the consent prompt's `missing*` details, what the grant lacked when
 * the sign-in began (scopes it refused before are not among them: they are not given).
 */
function consentAdds(details: Record<string, unknown>) {
  return {
    scopes: (details.missingOIDCScope as string[] | undefined) ?? [],
    claims: (details.missingOIDCClaims as string[] | undefined) ?? [],
    resources: (details.missingResourceScopes as Record<string, string[]> | undefined) ?? {},
  };
}

/**
 * Adds to `grant` what the consent prompt's details say it lacks: what Allow gives.
 *
 * @example
 * ```ts
 * addConsent(grant, details.prompt.details);
 * await grant.save();
 * ```
 */
export function addConsent(grant: Grant, details: Record<string, unknown>): void {
  const { scopes, claims, resources } = consentAdds(details);
  if (scopes.length) grant.addOIDCScope(scopes.join(' '));
  if (claims.length) grant.addOIDCClaims(claims);
  for (const [resource, resourceScopes] of Object.entries(resources)) {
    grant.addResourceScope(resource, resourceScopes.join(' '));
  }
}

/**
 * Takes out of `grant` what {@link addConsent} added for these details: a Cancel after an Allow of a
 * re-consent. Left in, the next sign-in of that client would get it with no consent page, though the
 * person's last word on it was Cancel. Should another sign-in have allowed some of it meanwhile, that
 * goes too: the next sign-in asks again, never the reverse. True when it took anything out (a grant
 * that holds none of it needs no save).
 *
 * @example
 * ```ts
 * if (takeBackConsent(grant, details.prompt.details)) await grant.save();
 * ```
 */
export function takeBackConsent(grant: Grant, details: Record<string, unknown>): boolean {
  const held = JSON.stringify([grant.openid, grant.resources]);
  const { scopes, claims, resources } = consentAdds(details);
  const without = (held: string, taken: readonly string[]) =>
    held
      .split(' ')
      .filter((scope) => scope !== '' && !taken.includes(scope))
      .join(' ');
  if (grant.openid?.scope !== undefined) grant.openid.scope = without(grant.openid.scope, scopes);
  if (grant.openid?.claims) grant.openid.claims = grant.openid.claims.filter((claim) => !claims.includes(claim));
  for (const [resource, taken] of Object.entries(resources)) {
    const held = grant.resources?.[resource];
    if (grant.resources === undefined || held === undefined) continue;
    const left = without(held, taken);
    if (left) grant.resources[resource] = left;
    else delete grant.resources[resource];
  }
  return JSON.stringify([grant.openid, grant.resources]) !== held;
}
