/** Options of {@link principalScope}. */
export interface PrincipalScopeOptions {
  /**
   * Scope by the OAuth client acting for the user too (the principal's `clientId`): two clients of
   * one user then never share a key, and a principal without a client id has no scope. Default
   * false: the user alone, so every client of one user shares the user's keys.
   */
  perClient?: boolean | undefined;
}

/**
 * The default scope: the principal a guard attached to the request (`sub` and `iss` of a verified
 * token, and its `clientId` with `perClient`), or undefined when there is none. Never a client-sent
 * header. Adapters use it without options when no `scope` is given.
 *
 * @example
 * principalScope({ sub: 'user_1', iss: 'https://id.example' }); // '["https://id.example","user_1"]'
 * principalScope({ sub: 'user_1', iss: 'https://id.example', clientId: 'app' }, { perClient: true }); // '["https://id.example","user_1","app"]'
 * principalScope(undefined); // undefined
 */
export function principalScope(auth: unknown, options: PrincipalScopeOptions = {}): string | undefined {
  if (auth === null || typeof auth !== 'object') return undefined;
  const { sub, iss, clientId } = auth as { sub?: unknown; iss?: unknown; clientId?: unknown };
  if (typeof sub !== 'string' || sub.length === 0) return undefined;
  // JSON framing keeps the parts apart whatever characters they contain.
  const issuer = typeof iss === 'string' ? iss : '';
  if (options.perClient !== true) return JSON.stringify([issuer, sub]);
  if (typeof clientId !== 'string' || clientId.length === 0) return undefined;
  return JSON.stringify([issuer, sub, clientId]);
}
