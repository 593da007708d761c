import { type JWK, SignJWT } from 'jose';
import type { JwsAlgorithm } from './algorithms.js';
import { buildEngine } from './engine.js';
import type { GuardEvent } from './events.js';
import { extractHeaderToken } from './extract-token.js';
import { type Guard, guardFromEngine, internalTokenType } from './guard.js';
import type { LocalJwks, PublicKeyInput } from './guard-options.js';
import { defaultInternalTokenHeader } from './internal-header.js';
import { type InternalSigningKey, signingKeyRing, toSigningEntry } from './internal-signing-keys.js';
import type { InternalTokenIssuer } from './internal-token-issuer.js';
import type { RemoteJwksOptions } from './key-source.js';
import { type NamesAll, refuseUnknownOptions } from './option-names.js';
import { type Principal, principalFromClaims } from './principal.js';
import { seconds } from './seconds.js';

export type { InternalSigningKey } from './internal-signing-keys.js';

/**
 * Options of {@link createInternalTokenIssuer}.
 *
 * @example
 * const options: InternalTokenIssuerOptions = { issuer: 'https://gateway.example', ttl: 30 };
 */
export interface InternalTokenIssuerOptions {
  /** The gateway's issuer name (`iss` of every internal token). */
  issuer: string;
  /** Signing keys, newest first; the first signs. Default: one fresh Ed25519 key. */
  keys?: readonly InternalSigningKey[] | undefined;
  /** Lifetime of an internal token in seconds (default 60). */
  ttl?: number | undefined;
  /** Names of further claims copied from the caller's token (e.g. `['email', 'tenant']`). */
  claims?: readonly string[] | undefined;
  /**
   * How many keys `jwks()` keeps publishing, newest first (default 3). A key whose tokens may still
   * verify, or that has yet to sign, is published whatever this says.
   */
  maxPublishedKeys?: number | undefined;
  /**
   * Seconds between `rotate()` publishing a key and the key signing (default 60; 0 to 3600). Make it
   * at least the services' JWKS `cooldown` (default 30) plus any HTTP cache in front of the JWKS, so
   * a service has fetched the new key before the first token that names it (no `key_unknown`).
   */
  rotationDelay?: number | undefined;
  /** Clock in epoch milliseconds (default `Date.now`). */
  now?: (() => number) | undefined;
}

const issuerOptionNames = [
  'issuer',
  'keys',
  'ttl',
  'claims',
  'maxPublishedKeys',
  'rotationDelay',
  'now',
] as const satisfies readonly (keyof InternalTokenIssuerOptions)[];
const issuerOptionNamesAll: NamesAll<InternalTokenIssuerOptions, typeof issuerOptionNames> = true;
void issuerOptionNamesAll;

/** Claims reserved by the internal token; extra claims never overwrite them. */
const reservedClaims = new Set([
  'iss',
  'sub',
  'aud',
  'exp',
  'iat',
  'nbf',
  'jti',
  'scope',
  'roles',
  'client_id',
  'orig_iss',
  'orig_aud',
  'cnf',
  'nonce',
]);

/**
 * The gateway's internal token issuer (research section 4, lesson 2). Tokens are short-lived (60 s),
 * `aud` is the one upstream they are minted for, `iss` is the gateway, `typ` is `internal+jwt` so
 * they never pass as edge tokens (and edge tokens never pass as them), and they carry `sub`, `scope`,
 * `roles`, `client_id`, the original `jti`, and the original `iss`/`aud` as `orig_iss`/`orig_aud`.
 *
 * @example
 * const internal = createInternalTokenIssuer({ issuer: 'https://gateway.example' });
 * const token = await internal.mint(principal, { audience: 'orders-service' });
 * app.get('/.well-known/jwks.json', (_req, res) => res.json(internal.jwks()));
 */
export function createInternalTokenIssuer(options: InternalTokenIssuerOptions): InternalTokenIssuer {
  if (typeof options?.issuer !== 'string' || options.issuer.length === 0) {
    throw new TypeError('createInternalTokenIssuer needs an issuer');
  }
  refuseUnknownOptions(options, issuerOptionNames, 'createInternalTokenIssuer');
  const ttl = options.ttl ?? 60;
  if (!Number.isSafeInteger(ttl) || ttl < 1 || ttl > 3600) throw new TypeError('ttl must be 1 to 3600 seconds');
  const maxPublished = options.maxPublishedKeys ?? 3;
  if (!Number.isSafeInteger(maxPublished) || maxPublished < 1) throw new TypeError('maxPublishedKeys must be ≥ 1');
  const rotationDelay = seconds(options.rotationDelay ?? 60, 'rotationDelay', { max: 3600 });
  const now = options.now ?? Date.now;
  const extraClaims = (options.claims ?? []).filter((name) => !reservedClaims.has(name));
  const configured = options.keys !== undefined && options.keys.length > 0 ? options.keys : [undefined];
  const ring = signingKeyRing(
    configured.map((key) => toSigningEntry(key, Number.NEGATIVE_INFINITY)),
    { ttlMs: ttl * 1000, maxPublished, at: now() },
  );

  return {
    issuer: options.issuer,
    get currentKid() {
      return ring.signer(now()).kid;
    },
    async mint(principal, { audience }) {
      if (typeof audience !== 'string' || audience.length === 0) throw new TypeError('mint needs an audience');
      const at = now();
      const current = ring.signer(at);
      const issuedAt = Math.floor(at / 1000);
      const claims: Record<string, unknown> = {};
      for (const name of extraClaims) if (principal.claims[name] !== undefined) claims[name] = principal.claims[name];
      if (principal.scope.size > 0) claims.scope = [...principal.scope].join(' ');
      if (principal.roles.size > 0) claims.roles = [...principal.roles];
      if (principal.clientId !== undefined) claims.client_id = principal.clientId;
      if (principal.jti !== undefined) claims.jti = principal.jti;
      claims.orig_iss = principal.iss;
      claims.orig_aud = [...principal.aud];
      return new SignJWT(claims)
        .setProtectedHeader({ alg: current.alg, kid: current.kid, typ: internalTokenType })
        .setIssuer(options.issuer)
        .setSubject(principal.sub)
        .setAudience(audience)
        .setIssuedAt(issuedAt)
        .setExpirationTime(issuedAt + ttl)
        .sign(await current.signingKey);
    },
    jwks() {
      return { keys: ring.published(now()).map((entry) => ({ ...entry.publicJwk })) };
    },
    rotate(key, rotateOptions) {
      // Published now, signing later: services pick the key up before any token names it.
      const delay = seconds(rotateOptions?.delay ?? rotationDelay, 'rotate delay', { max: 3600 });
      const at = now();
      const entry = toSigningEntry(key, at + delay * 1000);
      ring.add(entry, at);
      return entry.kid;
    },
  };
}

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
