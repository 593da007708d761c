// What the guard glue knows of a request, shared with the idempotency middleware of this package
// (not exported from the package).
import type { Guard, GuardError } from '@idem/guard';
import type { Request, Response } from 'express';

// The guard that authenticated a request (or, `optional`, let it through as anonymous), so
// `authorize()` and the idempotency middleware answer with the same realm. A property under a symbol of this
// module, not a WeakMap: an entry per request in a weak collection is work for every scavenge.
const guardKey = Symbol('@idem/express guard');
type Guarded = Request & { [guardKey]?: Guard };
export const guardOf = {
  get: (request: Request): Guard | undefined => (request as Guarded)[guardKey],
  set: (request: Request, guard: Guard): void => {
    (request as Guarded)[guardKey] = guard;
  },
};

/**
 * The guard that let `req` through as anonymous (`optional`), or undefined: for the idempotency
 * middleware, which then answers 401 with that guard's challenge instead of `scope_missing`.
 */
export function anonymousGuardOf(req: Request): Guard | undefined {
  return req.auth === undefined ? guardOf.get(req) : undefined;
}

/** Answers a guard's refusal: its status, `WWW-Authenticate` challenge and problem+json. */
export function sendGuardError(res: Response, error: GuardError): void {
  res.status(error.status);
  res.setHeader('WWW-Authenticate', error.wwwAuthenticate);
  res.setHeader('Cache-Control', 'no-store');
  res.setHeader('Content-Type', 'application/problem+json');
  // `use_dpop_nonce` brings the nonce to retry with (RFC 9449 §9).
  if (error.dpopNonce !== undefined) res.setHeader('DPoP-Nonce', error.dpopNonce);
  res.end(JSON.stringify(error.toProblem()));
}
