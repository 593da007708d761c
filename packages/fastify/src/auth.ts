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
import type { FastifyPluginAsync } from 'fastify';
import fp from 'fastify-plugin';
import { type AnyServerReply, type AnyServerRequest, guardOf, sendGuardError } from './auth-state.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The caller, set by the `guard()` or `internalAuth()` hook; the idempotency plugin scopes keys by it. */
    auth?: Principal;
  }
}

/**
 * A Fastify hook (`onRequest` or `preHandler`) produced by this module, for an instance of any server
 * (HTTP/1.1, HTTPS, HTTP/2) and a route of any types.
 *
 * @example
 * const hooks: AuthHook[] = [guard(edge), authorize(requireScopes('orders:write'))];
 */
export type AuthHook = (request: AnyServerRequest, reply: AnyServerReply) => Promise<AnyServerReply | undefined>;

function view(request: AnyServerRequest, guard?: Guard): GuardRequest {
  return guardRequestFromNode(request.raw, {
    url: request.raw.url ?? request.url,
    ...(guard === undefined ? {} : { tokenHeaders: [guard.tokenHeader] }),
  });
}

function authenticateWith(instance: Guard, optional = false): AuthHook {
  return async (request, reply) => {
    const seen = view(request, instance);
    if (optional && !instance.carriesCredentials(seen)) {
      guardOf.set(request, instance);
      return undefined;
    }
    const result = await instance.authenticate(seen);
    if (!result.ok) return sendGuardError(reply, result.error);
    request.auth = result.principal;
    // The next DPoP nonce, when the proof's was of the last window (RFC 9449 §9).
    if (result.dpopNonce !== undefined) reply.header('DPoP-Nonce', result.dpopNonce);
    guardOf.set(request, instance);
    return undefined;
  };
}

/**
 * A Fastify hook that verifies the bearer token (see `createGuard` in @idem/guard) and sets
 * `request.auth`. Use it as `onRequest` (the earliest point: the body is never read for a refused
 * request), per route or for the whole instance. A refusal is 401 (or 400) problem+json with an
 * RFC 6750 `WWW-Authenticate` challenge. Register {@link authPlugin} once to decorate `request.auth`.
 *
 * @example
 * import Fastify from 'fastify';
 * import { authPlugin, guard, authorize } from '@idem/fastify';
 * import { requireScopes } from '@idem/guard';
 *
 * const app = Fastify();
 * await app.register(authPlugin);
 * const verify = guard({ audience: 'https://api.example', issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] });
 * app.post('/orders', { onRequest: [verify, authorize(requireScopes('orders:write'))] }, async (request) => ({ by: request.auth?.sub }));
 */
export function guard(options: GuardOptions | Guard, glue: GuardGlueOptions = {}): AuthHook {
  const instance = isGuard(options) ? options : createGuard(options);
  return authenticateWith(instance, optionalGuard(glue, instance));
}

/**
 * A Fastify hook for services behind the gateway: verifies the internal token header (signature,
 * audience, expiry only) and sets `request.auth` to the same principal shape.
 *
 * @example
 * app.addHook('onRequest', internalAuth({ issuer: 'https://gateway.example', audience: 'orders-service', jwks }));
 */
export function internalAuth(options: InternalVerifierOptions | Guard): AuthHook {
  return authenticateWith(isGuard(options) ? options : createInternalVerifier(options));
}

/**
 * A Fastify hook that checks `request.auth` against requirements (`requireScopes`, `requireRoles`,
 * `requireAnyRole`, `policy` from @idem/guard): 403 `insufficient_scope` on refusal, 401 when the
 * request was never authenticated. Place it after `guard()` in the same hook list.
 *
 * @example
 * app.delete('/orders/:id', { onRequest: [verify, authorize(requireRoles('admin'))] }, handler);
 */
export function authorize(...requirements: Requirement[]): AuthHook {
  return async (request, reply) => {
    const instance = guardOf.get(request);
    if (request.auth === undefined || request.auth === null || instance === undefined) {
      // authorize() without a guard before it: answer as unauthenticated rather than let the request through.
      return sendGuardError(reply, instance?.error('token_missing') ?? new GuardError('token_missing'));
    }
    const decision = instance.authorize(request.auth, requirements, { ...view(request), params: request.params });
    if (!decision.ok) return sendGuardError(reply, decision.error);
    return undefined;
  };
}

/**
 * Options of {@link authPlugin}.
 *
 * @example
 * const options: AuthPluginOptions = { guard: edge };
 */
export interface AuthPluginOptions {
  /** Verify every request of the instance with this guard (an `onRequest` hook). */
  guard?: GuardOptions | Guard | undefined;
  /** Or, behind the gateway, verify every request's internal token. */
  internal?: InternalVerifierOptions | Guard | undefined;
}

const plugin: FastifyPluginAsync<AuthPluginOptions> = async (fastify, options) => {
  // Declares `request.auth` up front so every request object keeps one shape.
  fastify.decorateRequest('auth', undefined);
  if (options.guard !== undefined && options.internal !== undefined) {
    throw new TypeError('authPlugin takes guard or internal, not both');
  }
  if (options.guard !== undefined) fastify.addHook('onRequest', guard(options.guard));
  if (options.internal !== undefined) fastify.addHook('onRequest', internalAuth(options.internal));
};

/**
 * Fastify plugin that decorates `request.auth` and, when given `guard` or `internal`, verifies every
 * request of the instance (wrapped with fastify-plugin, so it applies to the registering scope).
 *
 * @example
 * await app.register(authPlugin, { guard: { audience: 'https://api.example', issuers } });
 */
export const authPlugin = fp(plugin, { fastify: '5.x', name: '@idem/fastify-auth' });

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
 * const headers = await forwardHeaders(request, { audience: 'orders-service' }); // guard built with internalTokens
 */
export function forwardHeaders(
  request: AnyServerRequest,
  options: GlueForwardOptions,
): Promise<Record<string, string>> {
  if (request.auth === undefined || request.auth === null) {
    throw new TypeError('forwardHeaders needs an authenticated request (run the guard hook first)');
  }
  const instance = guardOf.get(request);
  if (options.issuer !== undefined) {
    return forwardGuardHeaders(request.headers, request.auth, { ...options, issuer: options.issuer }).then(
      joinHeaderValues,
    );
  }
  if (instance === undefined)
    throw new TypeError('forwardHeaders needs an issuer, or a guard created with internalTokens');
  return instance.forwardHeaders(request.headers, request.auth, options).then(joinHeaderValues);
}

export type { GuardGlueOptions } from '@idem/guard';
