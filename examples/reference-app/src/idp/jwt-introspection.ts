import { createPublicKey } from 'node:crypto';
import { createLocalJWKSet, type JWK, type JWTPayload, jwtVerify } from 'jose';
import type Provider from 'oidc-provider';
import { errors, type KoaContextWithOIDC } from 'oidc-provider';
import type { SigningJwk } from './secrets.js';

type ProviderMiddleware = Parameters<Provider['use']>[0];
type Client = NonNullable<KoaContextWithOIDC['oidc']['client']>;

/** What {@link jwtIntrospection} needs. */
export interface JwtIntrospectionOptions {
  /** The provider: its `introspection.error` event says which requests it refused for being a JWT. */
  provider: Provider;
  /** Its issuer identifier, the `iss` every token it signs carries. */
  issuer: string;
  /** Its signing keys (private JWKs, as its `jwks` option has them): their public halves verify. */
  keys: readonly SigningJwk[];
  /** Allowed clock skew on `exp` and `nbf`, in seconds: the gateway's. */
  clockTolerance: number;
  /**
   * Whether `client` (authenticated) may learn about a token issued to `clientId`: the introspection
   * `allowedPolicy` of the provider, so opaque tokens and JWTs answer to the same callers.
   */
  mayIntrospect: (client: Client, clientId: string) => boolean;
}

/** The public half of a private JWK, with its `kid`, `alg` and `use`. */
function publicJwk(key: SigningJwk): JWK {
  const half = createPublicKey({ key, format: 'jwk' }).export({ format: 'jwk' });
  return { ...half, kid: key.kid, alg: key.alg, use: key.use } as JWK;
}

/**
 * A `provider.use` middleware that describes, at the introspection endpoint (RFC 7662), the JWT access
 * tokens (RFC 9068) the provider issued, which oidc-provider refuses to introspect with 400
 * `unsupported_token_type`: an error RFC 7662 does not have, on which every RFC 7662 client (oauth4webapi
 * among them) throws. Section 2.2 answers a token the server will not describe with 200
 * `{"active": false}`, and that is the least this answers.
 *
 * The token is active when it verifies with the provider's own keys (`typ` `at+jwt`, `iss` the
 * issuer, `exp` and `nbf` within the gateway's clock tolerance) and names as its `client_id` the
 * authenticated client asking, which {@link JwtIntrospectionOptions.mayIntrospect} allows (RFC 7662
 * section 2.1 leaves who may introspect to the server: a client its own tokens, as for opaque ones).
 * Anything else is `{"active": false}`, never an error: a stranger learns nothing from the answer.
 *
 * What it cannot check: whether the grant still stands. oidc-provider keeps no record of a JWT access
 * token and puts no grant id in it (`jti`, `sub`, `client_id`, `scope`, `aud`, `cnf` only), so a JWT
 * stays active here until its `exp` after its grant is revoked, as it stays valid at the gateway: the
 * reason it lives only 5 minutes.
 *
 * Runs after oidc-provider has authenticated the client and read the parameters: only a request it
 * refused for carrying a JWT, which its event names whatever the body became (JSON, or our error page
 * for a client asking for HTML), is answered here. Opaque tokens never reach this.
 *
 * @example
 * ```ts
 * provider.use(jwtIntrospection({ provider, issuer, keys, clockTolerance: 5, mayIntrospect }));
 * ```
 */
export function jwtIntrospection(options: JwtIntrospectionOptions): ProviderMiddleware {
  const { provider, issuer, clockTolerance, mayIntrospect } = options;
  const keySet = createLocalJWKSet({ keys: options.keys.map(publicJwk) });
  const algorithms = [...new Set(options.keys.map((key) => key.alg))];
  const refusedJwts = new WeakSet<object>();
  provider.on('introspection.error', (ctx, error) => {
    if (error instanceof errors.UnsupportedTokenType) refusedJwts.add(ctx);
  });

  async function describe(token: unknown, client: Client | undefined): Promise<Record<string, unknown>> {
    if (typeof token !== 'string' || !client) return { active: false };
    let payload: JWTPayload;
    try {
      ({ payload } = await jwtVerify(token, keySet, {
        issuer,
        typ: 'at+jwt',
        algorithms,
        clockTolerance,
        requiredClaims: ['exp', 'iat', 'jti', 'sub', 'aud', 'client_id'],
      }));
    } catch {
      return { active: false };
    }
    const clientId = payload.client_id;
    if (typeof clientId !== 'string' || !mayIntrospect(client, clientId)) return { active: false };
    const jkt = (payload.cnf as { jkt?: unknown } | undefined)?.jkt;
    return {
      active: true,
      client_id: clientId,
      sub: payload.sub,
      scope: payload.scope,
      aud: payload.aud,
      iss: payload.iss,
      exp: payload.exp,
      iat: payload.iat,
      jti: payload.jti,
      // RFC 9449 section 6.2: a bound token is introspected with its key's thumbprint.
      ...(typeof jkt === 'string' ? { token_type: 'DPoP', cnf: { jkt } } : { token_type: 'Bearer' }),
    };
  }

  return async (ctx, next) => {
    await next();
    if (!refusedJwts.has(ctx)) return;
    const { oidc } = ctx as unknown as KoaContextWithOIDC;
    const body = await describe(oidc.params?.token, oidc.client);
    ctx.status = 200;
    ctx.body = body;
    ctx.type = 'application/json; charset=utf-8';
  };
}
