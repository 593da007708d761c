import type { JwsAlgorithm } from './algorithms.js';
import { buildEngine } from './engine.js';
import type { GuardEvent } from './events.js';
import { extractHeaderToken } from './extract-token.js';
import { type Guard, guardFromEngine } from './guard.js';
import type { LocalJwks, PublicKeyInput } from './guard-options.js';
import { internalTokenType } from './guard-typ.js';
import { defaultInternalTokenHeader } from './internal-header.js';
import type { RemoteJwksOptions } from './key-source.js';
import { type NamesAll, refuseUnknownOptions } from './option-names.js';
import { type Principal, principalFromClaims } from './principal.js';

/**
 * Options of {@link createInternalVerifier}. Durations in seconds.
 *
 * @example
 * const options: InternalVerifierOptions = { issuer: 'https://gateway.example', audience: 'orders-service', jwksUri: 'https://gateway.example/jwks' };
 */
export interface InternalVerifierOptions {
  /** The gateway's issuer name. */
  issuer: string;
  /** This service's name: the `aud` the gateway minted for it. */
  audience: string | readonly string[];
  /** The gateway's public keys (PEM or JWK). */
  keys?: readonly PublicKeyInput[] | undefined;
  /**
   * The gateway's JWKS: an object (loaded from a file), or, in the gateway's own process, a function
   * read on every lookup, `() => issuer.jwks()`, which follows `rotate()`. The object
   * `issuer.jwks()` is a copy of the moment: after a `rotate()` its verifier refuses every token.
   */
  jwks?: LocalJwks | undefined;
  /** The gateway's JWKS URL. */
  jwksUri?: string | undefined;
  jwksOptions?: Omit<RemoteJwksOptions, 'uri'> | undefined;
  /** Accepted algorithms (default `['EdDSA', 'ES256']`). */
  algorithms?: readonly JwsAlgorithm[] | undefined;
  /** Header carrying the token (default `idem-internal-token`). */
  header?: string | undefined;
  /** Allowed clock skew (default 5, at most 60). */
  clockTolerance?: number | undefined;
  realm?: string | undefined;
  /**
   * RFC 9728 metadata URL for `resource_metadata="..."` in this service's challenges: the gateway's,
   * since to the client the service is the resource behind it. A 403 `insufficient_scope` comes from
   * here, not from the gateway, and without it that one challenge would not say where to step up.
   */
  resourceMetadata?: string | undefined;
  now?: (() => number) | undefined;
  fetch?: typeof globalThis.fetch | undefined;
  onEvent?: ((event: GuardEvent) => void) | undefined;
  cache?: false | { maxEntries?: number | undefined } | undefined;
}

const verifierOptionNames = [
  'issuer',
  'audience',
  'keys',
  'jwks',
  'jwksUri',
  'jwksOptions',
  'algorithms',
  'header',
  'clockTolerance',
  'realm',
  'resourceMetadata',
  'now',
  'fetch',
  'onEvent',
  'cache',
] as const satisfies readonly (keyof InternalVerifierOptions)[];
const verifierOptionNamesAll: NamesAll<InternalVerifierOptions, typeof verifierOptionNames> = true;
void verifierOptionNamesAll;

/**
 * The verifier for services behind the gateway. It checks only what spec 5.3 asks of them: the
 * gateway's signature, this service's audience, expiry, and the `internal+jwt` type. The caller's own
 * token was validated at the edge and is not re-validated. It yields the same {@link Principal} shape
 * (with the original issuer and audience) and reads the token from the internal header.
 *
 * @example
 * const verifier = createInternalVerifier({ issuer: 'https://gateway.example', audience: 'orders-service', jwks });
 * const result = await verifier.authenticate({ headers: req.headers });
 */
export function createInternalVerifier(options: InternalVerifierOptions): Guard {
  if (options === null || typeof options !== 'object') throw new TypeError('createInternalVerifier needs options');
  refuseUnknownOptions(options, verifierOptionNames, 'createInternalVerifier');
  const header = (options.header ?? defaultInternalTokenHeader).toLowerCase();
  const { engine, stats, realm } = buildEngine(
    {
      issuers: [
        {
          issuer: options.issuer,
          audience: options.audience,
          algorithms: options.algorithms ?? ['EdDSA', 'ES256'],
          ...(options.keys === undefined ? {} : { publicKeys: options.keys }),
          ...(options.jwks === undefined ? {} : { jwks: options.jwks }),
          ...(options.jwksUri === undefined ? {} : { jwksUri: options.jwksUri }),
          ...(options.jwksOptions === undefined ? {} : { jwksOptions: options.jwksOptions }),
          typ: [internalTokenType],
          ...(options.clockTolerance === undefined ? {} : { clockTolerance: options.clockTolerance }),
        },
      ],
      // Guard-wide too, not only on the gateway's issuer: authorize() reads it for an `auth_time`
      // of a principal whose `iss` is the edge issuer, which this verifier does not list.
      ...(options.clockTolerance === undefined ? {} : { clockTolerance: options.clockTolerance }),
      ...(options.realm === undefined ? {} : { realm: options.realm }),
      ...(options.resourceMetadata === undefined ? {} : { resourceMetadata: options.resourceMetadata }),
      ...(options.now === undefined ? {} : { now: options.now }),
      ...(options.fetch === undefined ? {} : { fetch: options.fetch }),
      ...(options.onEvent === undefined ? {} : { onEvent: options.onEvent }),
      ...(options.cache === undefined ? {} : { cache: options.cache }),
    },
    {
      refusedTypes: new Set(),
      principal: (claims, issuer) =>
        principalFromClaims(claims, {
          rolesClaim: issuer.rolesClaim,
          issuer: typeof claims.orig_iss === 'string' ? claims.orig_iss : issuer.issuer,
          ...(Array.isArray(claims.orig_aud) && claims.orig_aud.every((item) => typeof item === 'string')
            ? { audience: claims.orig_aud as string[] }
            : {}),
        }),
    },
  );
  return guardFromEngine(engine, stats, realm, header, (request) =>
    extractHeaderToken(request, header, engine.limits.maxTokenLength),
  );
}

/**
 * One-shot form of {@link createInternalVerifier}: verifies a single internal token with keys given in
 * the options (`keys` or `jwks`). Prefer a verifier built once per process; this one imports the keys
 * on every call. `jwksUri` (and `jwksOptions`) is a `TypeError` here: each call would fetch the JWKS
 * again, one request to the gateway per request served. A remote JWKS needs the cache, cooldown and
 * refresh rules of a verifier that lives as long as the process: {@link createInternalVerifier}.
 *
 * @example
 * const result = await verifyInternalToken(token, { issuer: 'https://gateway.example', audience: 'orders', jwks });
 */
export function verifyInternalToken(token: string, options: InternalVerifierOptions) {
  // A hidden module-level cache keyed by URI was the other way. It would have to choose whose `fetch`,
  // headers, `now` and `onEvent` a URI's entry keeps, and would grow with every URI ever passed.
  for (const name of ['jwksUri', 'jwksOptions'] as const) {
    if (options?.[name] !== undefined) {
      throw new TypeError(
        `verifyInternalToken does not take ${name}: it would fetch the JWKS on every call. Build one verifier with createInternalVerifier({ jwksUri, ... }) and reuse it`,
      );
    }
  }
  return createInternalVerifier({ ...options, cache: false }).verify(token);
}
