import {
  createGuard,
  createInternalVerifier,
  type ForwardOptions,
  forwardHeaders as forwardGuardHeaders,
  type Guard,
  GuardError,
  type GuardGlueOptions,
  type GuardOptions,
  type GuardRequest,
  guardRequestFromNode,
  type InternalTokenIssuer,
  type InternalVerifierOptions,
  isGuard,
  joinHeaderValues,
  optionalGuard,
  type Principal,
  type Requirement,
} from '@idem/guard';
import type { Context, Middleware, Next } from 'koa';
import { guardOf, sendGuardError } from './auth-state.js';

declare module 'koa' {
  // Koa's own extension point for `ctx.state`: without it `ctx.state.auth` is `any`.
  interface DefaultState {
    /** The caller, set by `guard()` or `internalAuth()`; the idempotency middleware scopes keys by it. */
    auth?: Principal;
  }
}

function view(ctx: Context, guard?: Guard): GuardRequest {
  return guardRequestFromNode(ctx.req, {
    url: ctx.originalUrl ?? ctx.url,
    ...(guard === undefined ? {} : { tokenHeaders: [guard.tokenHeader] }),
  });
}

function authenticateWith(instance: Guard, optional = false): Middleware {
  return async (ctx: Context, next: Next) => {
    const request = view(ctx, instance);
    if (optional && !instance.carriesCredentials(request)) {
      guardOf.set(ctx, instance);
      await next();
      return;
    }
    const result = await instance.authenticate(request);
    if (!result.ok) {
      sendGuardError(ctx, result.error);
      return;
    }
    ctx.state.auth = result.principal;
    guardOf.set(ctx, instance);
    const nonce = result.dpopNonce;
    if (nonce === undefined) {
      await next();
      return;
    }
    // The next DPoP nonce, when the proof's was of the last window (RFC 9449 §9).
    ctx.set('DPoP-Nonce', nonce);
    try {
      await next();
    } catch (error) {
      // Koa's error answer removes every header set before the throw and sets the error's own
      // `headers`: the nonce rides on those, or the client spends a request on use_dpop_nonce.
      throw withHeader(error, 'DPoP-Nonce', nonce);
    }
  };
}

// The thrown value with `name: value` added to its `headers` (a new object: the error's own may be
// shared), when it is an object that takes the property; anything else unchanged.
function withHeader(error: unknown, name: string, value: string): unknown {
  if (error === null || typeof error !== 'object') return error;
  const carrier = error as { headers?: Record<string, unknown> };
  try {
    const headers = carrier.headers !== null && typeof carrier.headers === 'object' ? carrier.headers : {};
    carrier.headers = { ...headers, [name]: value };
  } catch {
    // A frozen error or a read-only `headers`: Koa answers without the header, as before.
  }
  return error;
}

/**
 * Koa middleware that verifies the bearer token (see `createGuard` in @idem/guard) and sets
 * `ctx.state.auth` to the caller's principal. A refusal is answered here: 401 (or 400)
 * problem+json with an RFC 6750 `WWW-Authenticate` challenge; later middleware never runs.
 *
 * @example
 * import Koa from 'koa';
 * import { guard } from '@idem/koa';
 *
 * const app = new Koa();
 * app.use(guard({ audience: 'https://api.example', issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] }));
 * app.use((ctx) => { ctx.body = { by: ctx.state.auth?.sub }; });
 */
export function guard(options: GuardOptions | Guard, glue: GuardGlueOptions = {}): Middleware {
  const instance = isGuard(options) ? options : createGuard(options);
  return authenticateWith(instance, optionalGuard(glue, instance));
}

/**
 * Koa middleware for services behind the gateway: verifies the internal token header (signature,
 * audience, expiry only) and sets `ctx.state.auth` to the same principal shape.
 *
 * @example
 * app.use(internalAuth({ issuer: 'https://gateway.example', audience: 'orders-service', jwksUri: 'https://gateway.example/jwks' }));
 */
export function internalAuth(options: InternalVerifierOptions | Guard): Middleware {
  return authenticateWith(isGuard(options) ? options : createInternalVerifier(options));
}

/**
 * Koa middleware that checks `ctx.state.auth` against requirements (`requireScopes`, `requireRoles`,
 * `requireAnyRole`, `policy` from @idem/guard): 403 `insufficient_scope` on refusal, 401 when the
 * request was never authenticated.
 *
 * @example
 * router.delete('/orders/:id', authorize(requireRoles('admin')), handler);
 */
export function authorize(...requirements: Requirement[]): Middleware {
  return async (ctx: Context, next: Next) => {
    const instance = guardOf.get(ctx);
    const principal = ctx.state.auth as Principal | undefined;
    if (principal === undefined || instance === undefined) {
      // authorize() without a guard before it: answer as unauthenticated rather than let the request through.
      sendGuardError(ctx, instance?.error('token_missing') ?? new GuardError('token_missing'));
      return;
    }
    const params = (ctx as Context & { params?: unknown }).params;
    const decision = instance.authorize(principal, requirements, { ...view(ctx), params });
    if (!decision.ok) {
      sendGuardError(ctx, decision.error);
      return;
    }
    await next();
  };
}

/**
 * Options of the glue's `forwardHeaders`: the guard's `internalTokens` issuer is used unless `issuer`
 * is given.
 *
 * @example
 * const options: GlueForwardOptions = { audience: 'orders-service' };
 */
export type GlueForwardOptions = Omit<ForwardOptions, 'issuer'> & { issuer?: InternalTokenIssuer | undefined };

/**
 * For a gateway route: the headers to send upstream. Identity header families are stripped, the
 * caller's bearer token is dropped, and a fresh internal token for `audience` is added. The result
 * is a plain string map, ready for `fetch` or `http.request`.
 *
 * @example
 * const headers = await forwardHeaders(ctx, { audience: 'orders-service' }); // guard built with internalTokens
 */
export function forwardHeaders(ctx: Context, options: GlueForwardOptions): Promise<Record<string, string>> {
  const principal = ctx.state.auth as Principal | undefined;
  if (principal === undefined)
    throw new TypeError('forwardHeaders needs an authenticated request (mount guard() first)');
  const instance = guardOf.get(ctx);
  if (options.issuer !== undefined) {
    return forwardGuardHeaders(ctx.req.headers, principal, { ...options, issuer: options.issuer }).then(
      joinHeaderValues,
    );
  }
  if (instance === undefined)
    throw new TypeError('forwardHeaders needs an issuer, or a guard created with internalTokens');
  return instance.forwardHeaders(ctx.req.headers, principal, options).then(joinHeaderValues);
}

export type { GuardGlueOptions } from '@idem/guard';
