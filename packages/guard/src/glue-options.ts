import type { Guard } from './guard.js';

/**
 * Options of the framework glue's `guard()` (`@idem/express`, `@idem/fastify`, `@idem/koa`).
 *
 * @example
 * import { guard } from '@idem/express';
 * app.get('/products', guard(edge, { optional: true }), listProducts);
 */
export interface GuardGlueOptions {
  /**
   * Let a request that carries no credentials at all (no `Authorization`, no `DPoP` where the guard
   * takes it, no `access_token` where it reads one) through without a principal, for routes that
   * serve everyone and some callers more. A request that carries any is verified as usual, and a
   * bad or foreign one (`Basic`) is refused: a client that sent a credential is never served as
   * anonymous. `authorize()` after it answers an anonymous request 401 with this guard's challenge,
   * and so does the idempotency middleware where it scopes keys by the default principal (an
   * anonymous write has no caller to scope its key to). Default false.
   */
  optional?: boolean | undefined;
}

/**
 * `optional` of {@link GuardGlueOptions}, checked once when the glue is made: a boolean, and a guard
 * of one's own that can tell an anonymous request (`carriesCredentials`). Throws a `TypeError`.
 *
 * @example
 * const optional = optionalGuard({ optional: true }, instance); // true
 */
export function optionalGuard(glue: GuardGlueOptions | undefined, instance: Guard): boolean {
  if (glue === null || (glue !== undefined && typeof glue !== 'object')) {
    throw new TypeError('the guard glue options must be an object');
  }
  const optional = glue?.optional ?? false;
  if (typeof optional !== 'boolean') throw new TypeError('optional must be a boolean');
  if (optional && typeof instance.carriesCredentials !== 'function') {
    throw new TypeError('optional needs a guard that can tell an anonymous request (carriesCredentials)');
  }
  return optional;
}
