import type { Principal } from '@idem/guard';

/**
 * The scope of the reference app's `Idempotency-Key`s: the user (issuer and `sub`) and the OAuth
 * client acting for them (`client_id`). Scoped by the user alone, two clients of one user that
 * happen to pick the same key would collide: the second would get the first one's stored answer, or a
 * 422 for a request it never sent. A principal without a client id gets no scope (the adapter answers
 * 500 `scope_missing`); the gateway lets no such token through (it requires `client_id`).
 *
 * @example
 * ```ts
 * app.post('/charges', idempotency({ store, scope: (req) => userAndClientScope(req.auth) }), handler);
 * userAndClientScope(principal); // '["https://id.example","user-alice","photo-app"]'
 * ```
 */
export function userAndClientScope(
  principal: Pick<Principal, 'sub' | 'iss' | 'clientId'> | undefined,
): string | undefined {
  if (typeof principal?.sub !== 'string' || principal.sub.length === 0) return undefined;
  if (typeof principal.clientId !== 'string' || principal.clientId.length === 0) return undefined;
  // JSON framing keeps issuer, user and client apart whatever characters they contain.
  return JSON.stringify([principal.iss, principal.sub, principal.clientId]);
}
