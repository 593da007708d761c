import type { JWK } from 'jose';
import type { JwsAlgorithm } from './algorithms.js';
import type { ClaimValue } from './claims.js';
import type { TokenLimits } from './compact-jws.js';
import type { DpopOptions } from './dpop.js';
import type { GuardEvent } from './events.js';
import type { InternalTokenIssuer } from './internal-token-issuer.js';
import type { RemoteJwksOptions } from './key-source.js';
import type { MtlsOptions } from './mtls.js';
import type { NamesAll } from './option-names.js';

/**
 * A configured public key: PEM text, a JWK object, or PEM with its kid and algorithm.
 *
 * @example
 * const key: PublicKeyInput = { pem, kid: '2026-01', alg: 'RS256' };
 */
export type PublicKeyInput = string | JWK | PemKeyInput;

/**
 * PEM text with the `kid` and algorithm it is published under. Its own type, so that a misspelt
 * member (`kdi`, `pme`) or an algorithm that does not exist is a compile error, not a key dropped at
 * run time.
 *
 * @example
 * const key: PemKeyInput = { pem, kid: '2026-01', alg: 'RS256' };
 */
export interface PemKeyInput {
  pem: string;
  kid?: string | undefined;
  alg?: JwsAlgorithm | undefined;
}

/**
 * Rules shared by the guard and each issuer (an issuer's own value wins). Durations in seconds.
 *
 * @example
 * const rules: TokenRules = { audience: 'https://api.example', maxTokenAge: 3600, requiredClaims: ['client_id'] };
 */
export interface TokenRules {
  /** Accepted audiences; `aud` must contain one. Required (here or on every issuer). */
  audience?: string | readonly string[] | undefined;
  /**
   * The claim the audience is read from (default `aud`). For issuers whose access tokens carry no
   * `aud` and name the client instead: AWS Cognito's (`client_id`, with `audience` the app client id;
   * its ID tokens, which have `aud` but no `client_id`, are then refused).
   */
  audienceClaim?: string | undefined;
  /** Allowed clock skew (default 5, at most 60). */
  clockTolerance?: number | undefined;
  /** Refuse tokens whose `iat` is older than this (then `iat` is required). */
  maxTokenAge?: number | undefined;
  /** Refuse tokens whose lifetime (`exp - iat`) is longer than this. */
  maxLifetime?: number | undefined;
  /**
   * Accepted `typ` values, compared case-insensitively with an optional `application/` prefix
   * (default `['at+jwt']`, RFC 9068). Add `'jwt'` (and `null` for no `typ`) only for issuers that
   * cannot type their access tokens; a token carrying `nonce` is still refused as an ID token.
   */
  typ?: ReadonlyArray<string | null> | undefined;
  /** Claims that must be present besides `iss`, `sub`, `aud` and `exp` (e.g. `['client_id', 'jti', 'iat']`). */
  requiredClaims?: readonly string[] | undefined;
  /**
   * Claims that must hold one of the given values, compared exactly (no case folding, no coercion: `2`
   * is not `'2'`); a token without the claim is refused (`claim_invalid`). For the kind of token an
   * issuer marks in a claim of its own: `{ typ: 'Bearer' }` refuses Keycloak's ID tokens (`typ: ID`),
   * `{ token_use: 'access' }` Cognito's. On an issuer it replaces the guard-wide rules. `iss`, `aud`,
   * `exp`, `nbf`, `iat` and `cnf` have options of their own and are refused here.
   */
  claimValues?: Readonly<Record<string, ClaimValue | readonly ClaimValue[]>> | undefined;
  /**
   * The claim holding roles (default `roles`), or the path to it inside nested claims as an array of
   * member names: `['realm_access', 'roles']` for Keycloak's realm roles. (A path is an array, not a
   * dotted string: claim names may hold dots, as Auth0's namespaced `https://example.com/roles` does.)
   */
  rolesClaim?: string | readonly string[] | undefined;
  /** `crit` header parameters this deployment understands (default none: any `crit` is refused). */
  crit?: readonly string[] | undefined;
}

/**
 * One trusted issuer and where its keys come from. A key only ever verifies tokens of its issuer.
 *
 * @example
 * const issuer: IssuerOptions = { issuer: 'https://id.example', publicKeys: [pem], algorithms: ['ES256'] };
 */
export interface IssuerOptions extends TokenRules {
  /** The exact `iss` value (no normalisation: a trailing slash or case change is another issuer). */
  issuer: string;
  /**
   * Algorithms accepted for this issuer (default `['HS256']` with a secret, otherwise
   * `['RS256', 'PS256', 'ES256', 'EdDSA', 'Ed25519']`). Each key is pinned to one of them.
   */
  algorithms?: readonly JwsAlgorithm[] | undefined;
  /**
   * A shared HMAC secret: at least the hash length (32, 48 or 64 bytes for HS256, HS384, HS512; a
   * string counts its UTF-8 bytes), not one byte repeated. Not combinable with public keys.
   */
  secret?: string | Uint8Array | undefined;
  /** Public keys as PEM or JWK. */
  publicKeys?: readonly PublicKeyInput[] | undefined;
  /**
   * A local JWKS object, or a function returning one, read on every lookup (cheap: imported again
   * only when it changed): `() => internalIssuer.jwks()` follows the issuer's `rotate()` in the
   * same process, where an object would be a copy of the keys of the moment.
   */
  jwks?: LocalJwks | undefined;
  /** A remote JWKS URL. */
  jwksUri?: string | undefined;
  /** Cache, cooldown, timeout and stale-if-error settings of the remote JWKS. */
  jwksOptions?: Omit<RemoteJwksOptions, 'uri'> | undefined;
}

/** A local JWKS: the set, or a function returning the current set (see {@link IssuerOptions.jwks}). */
export type LocalJwks = { keys: readonly unknown[] } | (() => { keys: readonly unknown[] });

const tokenRuleNames = [
  'audience',
  'audienceClaim',
  'clockTolerance',
  'maxTokenAge',
  'maxLifetime',
  'typ',
  'requiredClaims',
  'claimValues',
  'rolesClaim',
  'crit',
] as const satisfies readonly (keyof TokenRules)[];
export const issuerOptionNames = [
  ...tokenRuleNames,
  'issuer',
  'algorithms',
  'secret',
  'publicKeys',
  'jwks',
  'jwksUri',
  'jwksOptions',
] as const satisfies readonly (keyof IssuerOptions)[];
const issuerNamesAll: NamesAll<IssuerOptions, typeof issuerOptionNames> = true;
export const jwksOptionNames = [
  'timeout',
  'cooldown',
  'defaultTtl',
  'minTtl',
  'maxTtl',
  'staleIfError',
  'negativeTtl',
  'maxBytes',
  'maxUnknownKids',
  'headers',
] as const satisfies readonly (keyof RemoteJwksOptions)[];
const jwksNamesAll: NamesAll<Omit<RemoteJwksOptions, 'uri'>, typeof jwksOptionNames> = true;
void [issuerNamesAll, jwksNamesAll];

/**
 * Options of {@link createGuard}.
 *
 * @example
 * const options: GuardOptions = { audience: 'https://api.example', issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] };
 */
export interface GuardOptions extends TokenRules {
  /** The trusted issuers (at least one). */
  issuers: readonly IssuerOptions[];
  /** `realm` of every challenge (default `api`). */
  realm?: string | undefined;
  /** RFC 9728 metadata URL announced in every challenge (400, 401 and 403). */
  resourceMetadata?: string | undefined;
  /**
   * Accept `?access_token=` when no Authorization header is sent (default false; RFC 6750 §2.3).
   * Not with `dpop: { required: true }` (a `TypeError`): a query token is a bearer token.
   */
  allowQueryToken?: boolean | undefined;
  /** Size and depth limits applied before any decoding (positive integers; `maxDepth` at most 1000). */
  limits?: Partial<TokenLimits> | undefined;
  /** The verified-token cache (default 10,000 entries), or `false` to verify every time. */
  cache?: false | { maxEntries?: number | undefined } | undefined;
  /** Clock in epoch milliseconds (default `Date.now`); injected by tests. */
  now?: (() => number) | undefined;
  /** `fetch` used for remote JWKS (default the global one). */
  fetch?: typeof globalThis.fetch | undefined;
  /** Hook receiving every {@link GuardEvent}. */
  onEvent?: ((event: GuardEvent) => void) | undefined;
  /** Accept DPoP-bound tokens with proofs (RFC 9449); `{ required: true }` refuses plain bearer tokens. */
  dpop?: DpopOptions | undefined;
  /**
   * Accept mTLS certificate-bound tokens (RFC 8705, `cnf["x5t#S256"]`): `{}` reads the TLS peer
   * certificate of the request's socket; `{ certificate }` reads it where a TLS-terminating proxy
   * puts it. Without it, a token with `cnf` is refused unless it comes with its DPoP proof.
   */
  mtls?: MtlsOptions | undefined;
  /** The gateway's internal token issuer, used by `guard.forwardHeaders()` and the glue's `forwardHeaders()`. */
  internalTokens?: InternalTokenIssuer | undefined;
}

export const guardOptionNames = [
  ...tokenRuleNames,
  'issuers',
  'realm',
  'resourceMetadata',
  'allowQueryToken',
  'limits',
  'cache',
  'now',
  'fetch',
  'onEvent',
  'dpop',
  'mtls',
  'internalTokens',
] as const satisfies readonly (keyof GuardOptions)[];
const guardNamesAll: NamesAll<GuardOptions, typeof guardOptionNames> = true;
void guardNamesAll;
