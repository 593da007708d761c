import type Provider from 'oidc-provider';

type ProviderMiddleware = Parameters<Provider['use']>[0];

// oidc-provider's description of a request to a client-authenticated endpoint (token, introspection,
// revocation, PAR) that names no client at all: no Authorization header, no client_id, no assertion.
const noClientAuthentication = 'no client authentication mechanism provided';

/**
 * A `provider.use` middleware: a request that sends no client authentication at all gets 401
 * `invalid_client` with a `Basic` challenge, the answer RFC 6749 section 5.2 gives for "no client
 * authentication included", instead of oidc-provider's 400 `invalid_request`. A client library set
 * up without its credentials by mistake then reports an authentication failure, the real cause,
 * rather than a malformed request. The challenge (RFC 7235 requires one on a 401) names the scheme
 * the provider takes, its issuer as the realm and the error, as the provider's own Basic challenges do.
 *
 * @example
 * ```ts
 * provider.use(clientAuthErrors(issuer));
 * ```
 */
export function clientAuthErrors(issuer: string): ProviderMiddleware {
  return async (koa, next) => {
    await next();
    const ctx = koa;
    const body = ctx.body as { error?: unknown; error_description?: unknown } | null | undefined;
    if (ctx.status !== 400 || typeof body !== 'object' || body === null) return;
    if (body.error !== 'invalid_request' || body.error_description !== noClientAuthentication) return;
    const description = 'no client authentication included';
    ctx.status = 401;
    ctx.body = { error: 'invalid_client', error_description: description };
    // With the error in it too: client libraries read a 401's error from its challenge.
    ctx.set('WWW-Authenticate', `Basic realm="${issuer}", error="invalid_client", error_description="${description}"`);
  };
}
