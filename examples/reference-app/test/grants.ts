// Reading and changing a grant as the identity provider stores it, for tests of consent.
import type { Database } from '../src/db.js';

/** The OpenID scope a stored grant holds (its payload's `openid.scope`); undefined once it is gone. */
export async function grantScope(db: Database, id: string): Promise<string | undefined> {
  const { rows } = await db.query<{ scope: string }>(
    "select payload #>> '{openid,scope}' as scope from idp_models where model = 'Grant' and id = $1",
    [id],
  );
  return rows[0]?.scope;
}

/**
 * Takes `scope` out of a stored grant, as if it had never been allowed: the next consent of its
 * account and client adds it back to this same grant. Answers the scope the grant holds now.
 *
 * @example
 * const narrow = await narrowGrant(db, grantId, 'email');
 */
export async function narrowGrant(db: Database, id: string, scope: string): Promise<string> {
  const narrow = ((await grantScope(db, id)) ?? '')
    .split(' ')
    .filter((held) => held !== scope)
    .join(' ');
  await setGrantScope(db, id, narrow);
  return narrow;
}

/**
 * Sets the OIDC scope a stored grant holds, as another sign-in of it would have left it.
 *
 * @example
 * await setGrantScope(db, grantId, 'openid profile email');
 */
export async function setGrantScope(db: Database, id: string, scope: string): Promise<void> {
  await db.query(
    "update idp_models set payload = jsonb_set(payload, '{openid,scope}', to_jsonb($2::text)) where model = 'Grant' and id = $1",
    [id, scope],
  );
}
