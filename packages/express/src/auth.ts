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
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { guardOf, sendGuardError } from './auth-state.js';

// The middlewares are `RequestHandler<any>`, as connect's are for express.json(): with Express's
// default params, a route such as app.post('/orders/:id', authorize(...), handler) took its params
// from them instead of its path, and `req.params.id` became `string | string[]` in the handler.
type Middleware = RequestHandler<any>;

// On the global `Express.Request`, which every Express `Request` extends: an augmentation of
// 'express-serve-static-core' is lost where this package cannot resolve that module from its own
// folder (pnpm, npm's linked strategy, Yarn PnP), and then `req.auth` would not type-check.
declare global {
  namespace Express {
    interface Request {
      /** The caller, set by `guard()` or `internalAuth()`; the idempotency middleware scopes keys by it. */
      auth?: Principal;
    }
  }
}

function view(req: Request, guard?: Guard): GuardRequest {
  return guardRequestFromNode(req, {
    url: req.originalUrl ?? req.url,
    ...(guard === undefined ? {} : { tokenHeaders: [guard.tokenHeader] }),
  });
}

function authenticateWith(instance: Guard, optional = false): Middleware {
  return (req: Request, res: Response, next: NextFunction) => {
    const request = view(req, instance);
    if (optional && !instance.carriesCredentials(request)) {
      guardOf.set(req, instance);
      next();
      return;
    }
    instance
      .authenticate(request)
      .then((result) => {
        if (!result.ok) {
          sendGuardError(res, result.error);
          return;
        }
        req.auth = result.principal;
        // The next DPoP nonce, when the proof's was of the last window (RFC 9449 §9).
        if (result.dpopNonce !== undefined) res.setHeader('DPoP-Nonce', result.dpopNonce);
        guardOf.set(req, instance);
        next();
      })
      .catch(next);
  };
}

/**
 * Express middleware that verifies the bearer token (see `createGuard` in @idem/guard) and sets
 * `req.auth` to the caller's principal. A refusal is answered here: 401 (or 400) problem+json with an
 * RFC 6750 `WWW-Authenticate` challenge; the route handler never runs.
 *
 * @example
 * import express from 'express';
 * import { guard, authorize } from '@idem/express';
 * import { requireScopes } from '@idem/guard';
 *
 * const app = express();
 * app.use(guard({ audience: 'https://api.example', issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] }));
 * app.post('/orders', authorize(requireScopes('orders:write')), (req, res) => res.json({ by: req.auth?.sub }));
 */
export function guard(options: GuardOptions | Guard, glue: GuardGlueOptions = {}): Middleware {
  const instance = isGuard(options) ? options : createGuard(options);
  return authenticateWith(instance, optionalGuard(glue, instance));
}

/**
 * Express middleware for services behind the gateway: verifies the gateway's internal token header
 * (signature, audience, expiry only) and sets `req.auth` to the same principal shape.
 *
 * @example
 * app.use(internalAuth({ issuer: 'https://gateway.example', audience: 'orders-service', jwksUri: 'https://gateway.example/jwks' }));
 */
export function internalAuth(options: InternalVerifierOptions | Guard): Middleware {
  return authenticateWith(isGuard(options) ? options : createInternalVerifier(options));
}

/**
 * Express middleware that checks `req.auth` against requirements (`requireScopes`, `requireRoles`,
 * `requireAnyRole`, `policy` from @idem/guard). A refusal is 403 `insufficient_scope`; a request that
 * was never authenticated is 401.
 *
 * @example
 * app.delete('/orders/:id', authorize(requireRoles('admin')), handler);
 */
export function authorize(...requirements: Requirement[]): Middleware {
  return (req: Request, res: Response, next: NextFunction) => {
    const instance = guardOf.get(req);
    if (req.auth === undefined || instance === undefined) {
      // authorize() without a guard before it: answer as unauthenticated rather than let the request through.
      sendGuardError(res, instance?.error('token_missing') ?? new GuardError('token_missing'));
      return;
    }
    const decision = instance.authorize(req.auth, requirements, { ...view(req), params: req.params });
    if (!decision.ok) {
      sendGuardError(res, decision.error);
      return;
    }
    next();
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
 * const headers = await forwardHeaders(req, { audience: 'orders-service' }); // guard built with internalTokens
 */
export function forwardHeaders(req: Request, options: GlueForwardOptions): Promise<Record<string, string>> {
  if (req.auth === undefined)
    throw new TypeError('forwardHeaders needs an authenticated request (mount guard() first)');
  const instance = guardOf.get(req);
  if (options.issuer !== undefined) {
    return forwardGuardHeaders(req.headers, req.auth, { ...options, issuer: options.issuer }).then(joinHeaderValues);
  }
  if (instance === undefined)
    throw new TypeError('forwardHeaders needs an issuer, or a guard created with internalTokens');
  return instance.forwardHeaders(req.headers, req.auth, options).then(joinHeaderValues);
}

export type { GuardGlueOptions } from '@idem/guard';
