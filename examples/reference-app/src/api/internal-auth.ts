import type { Guard, Principal, Requirement } from '@idem/guard';
import type { NextFunction, Request, RequestHandler, Response } from 'express';

/** Where {@link internalAuth} puts the caller; read it with {@link principalOf}. */
interface AuthenticatedRequest extends Request {
  auth?: Principal;
}

/**
 * The caller of a request that passed {@link internalAuth}. Throws when the middleware did not run:
 * a route reading it without authentication is a wiring mistake, not a client error.
 *
 * @example
 * ```ts
 * app.get('/photos', internalAuth(verifier), (req, res) => res.json({ owner: principalOf(req).sub }));
 * ```
 */
export function principalOf(req: Request): Principal {
  const principal = (req as AuthenticatedRequest).auth;
  if (!principal) throw new Error('principalOf: internalAuth did not run for this route');
  return principal;
}

function refuse(res: Response, error: { status: number; wwwAuthenticate: string; toProblem(): unknown }): void {
  res
    .status(error.status)
    .set('WWW-Authenticate', error.wwwAuthenticate)
    .set('Cache-Control', 'no-store')
    .type('application/problem+json')
    .send(JSON.stringify(error.toProblem()));
}

/**
 * Accepts only the gateway's internal token (header `idem-internal-token`, `typ` `internal+jwt`,
 * `aud` this API, signed by the gateway's key). Anything else, a caller's own access token
 * included, is 401 with a `WWW-Authenticate` challenge: the API is reachable only through the gateway.
 * On success the verified caller is at `req.auth` (the default scope of `@idem/express`'s idempotency).
 *
 * @example
 * ```ts
 * app.use(internalAuth(createInternalVerifier({ issuer: gatewayUrl, audience: 'reference-api', jwks })));
 * ```
 */
export function internalAuth(verifier: Guard): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    verifier
      .authenticate({ headers: req.headers, url: req.url })
      .then((result) => {
        if (!result.ok) {
          refuse(res, result.error);
          return;
        }
        (req as AuthenticatedRequest).auth = result.principal;
        next();
      })
      .catch(next);
  };
}

/**
 * Refuses with 403 `insufficient_scope` (and a challenge naming the missing scopes) unless the caller
 * meets every requirement. Mount after {@link internalAuth}.
 *
 * @example
 * ```ts
 * app.post('/charges', authorize(verifier, requireScopes('charges:write')), handler);
 * ```
 */
export function authorize(verifier: Guard, ...requirements: Requirement[]): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    const decision = verifier.authorize(principalOf(req), requirements, { headers: req.headers, url: req.url });
    if (!decision.ok) {
      refuse(res, decision.error);
      return;
    }
    next();
  };
}
