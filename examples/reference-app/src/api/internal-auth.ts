import type { Principal } from '@idem/guard';
import type { Request } from 'express';

/**
 * The caller of a request that passed `internalAuth()` of `@idem/express` (which sets `req.auth`).
 * Throws when it did not run: a route reading the caller without authentication is a wiring
 * mistake, not a client error, and must never fall back to "anonymous".
 *
 * @example
 * ```ts
 * app.get('/photos', internalAuth(verifier), (req, res) => res.json({ owner: principalOf(req).sub }));
 * ```
 */
export function principalOf(req: Request): Principal {
  const principal = req.auth;
  if (!principal) throw new Error('principalOf: internalAuth did not run for this route');
  return principal;
}
