// What the guard glue knows of a request, shared with the idempotency middleware of this package
// (not exported from the package).
import type { Guard, GuardError } from '@idem/guard';
import type { Context } from 'koa';

// The guard that authenticated a request (or, `optional`, let it through as anonymous), so
// `authorize()` and the idempotency middleware answer with the same realm.
export const guardOf = new WeakMap<Context, Guard>();

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
  ctx.body = JSON.stringify(error.toProblem());
}
