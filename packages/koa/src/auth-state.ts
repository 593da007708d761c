// What the guard glue knows of a request, shared with the idempotency middleware of this package
// (not exported from the package).
import type { Guard, GuardError } from '@idem/guard';
import type { Context } from 'koa';

// The guard that authenticated a request (or, `optional`, let it through as anonymous), so
// `authorize()` and the idempotency middleware answer with the same realm. A property under a symbol of this
// module, not a WeakMap: an entry per request in a weak collection is work for every scavenge.
const guardKey = Symbol('@idem/koa guard');
type Guarded = Context & { [guardKey]?: Guard };
export const guardOf = {
  get: (request: Context): Guard | undefined => (request as Guarded)[guardKey],
  set: (request: Context, guard: Guard): void => {
    (request as Guarded)[guardKey] = guard;
  },
};

/**
 * The guard that let `ctx` through as anonymous (`optional`), or undefined: for the idempotency
 * middleware, which then answers 401 with that guard's challenge instead of `scope_missing`.
 */
export function anonymousGuardOf(ctx: Context): Guard | undefined {
  return ctx.state.auth === undefined ? guardOf.get(ctx) : undefined;
}

/** Answers a guard's refusal: its status, `WWW-Authenticate` challenge and problem+json. */
export function sendGuardError(ctx: Context, error: GuardError): void {
  ctx.status = error.status;
  ctx.set('WWW-Authenticate', error.wwwAuthenticate);
  ctx.set('Cache-Control', 'no-store');
  ctx.type = 'application/problem+json';
  // `use_dpop_nonce` brings the nonce to retry with (RFC 9449 §9).
  if (error.dpopNonce !== undefined) ctx.set('DPoP-Nonce', error.dpopNonce);
  ctx.body = JSON.stringify(error.toProblem());
}
