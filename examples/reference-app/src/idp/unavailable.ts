import type Provider from 'oidc-provider';
import { dbUnavailable, storeRetryAfterSeconds } from '../db-unavailable.js';

type ProviderMiddleware = Parameters<Provider['use']>[0];

/**
 * A `provider.use` middleware: an answer of oidc-provider's own endpoints (token, authorization,
 * end_session, introspection, revocation, userinfo) to a database that could not answer becomes 503
 * with `Retry-After` instead of its 500 `server_error` (DESIGN.md's HTTP table: a store that failed is
 * a 503, never a 500), so a client knows to try again rather than report a fault. oidc-provider
 * catches such an error in its own handler and tells it through its `server_error` event, which marks
 * the request; a bug (a TypeError and its kind) stays a 500. A JSON error says
 * `temporarily_unavailable`, RFC 6749 4.1.2.1's word for it (which identity providers give at the
 * token endpoint too); an HTML page keeps its text. A redirect to the client with `error` in it is
 * left as the provider made it. Registered first, it also answers such an error thrown by the
 * middlewares registered after it (ownPages), which Koa would answer a plain 500.
 *
 * @example
 * ```ts
 * provider.use(databaseUnavailable(provider));
 * ```
 */
export function databaseUnavailable(provider: Provider): ProviderMiddleware {
  const failed = new WeakSet<object>();
  provider.on('server_error', (ctx, error) => {
    if (dbUnavailable(error)) failed.add(ctx);
  });
  return async (ctx, next) => {
    try {
      await next();
    } catch (error) {
      // From a middleware of ours outside the provider's handler (the pages of ownPages): Koa would
      // answer it a plain-text 500.
      if (!dbUnavailable(error)) throw error;
      ctx.status = 503;
      ctx.set('Retry-After', String(storeRetryAfterSeconds));
      ctx.type = 'text/plain; charset=utf-8';
      ctx.body = 'The sign-in service could not reach its database. Try again in a moment.';
      return;
    }
    if (ctx.status !== 500 || !failed.has(ctx)) return;
    ctx.status = 503;
    ctx.set('Retry-After', String(storeRetryAfterSeconds));
    const body = ctx.body as { error?: unknown } | null | undefined;
    if (typeof body === 'object' && body !== null && !Buffer.isBuffer(body) && body.error === 'server_error') {
      ctx.body = {
        error: 'temporarily_unavailable',
        error_description: 'the provider could not reach its database; try again',
      };
    }
  };
}
