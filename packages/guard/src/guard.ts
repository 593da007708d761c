import type { JWK } from 'jose';
import { assertAlgorithms, type hmacMinimumBytes, type JwsAlgorithm } from './algorithms.js';
import { type AuthorizationResult, authorizeRequest, type Requirement } from './authorization.js';
import { type ClaimProfile, type ClaimValue, checkClaims } from './claims.js';
import {
  decodeUtf8Strict,
  defaultTokenLimits,
  isPlainObject,
  parseCompactJws,
  type TokenLimits,
} from './compact-jws.js';
import { checkConfirmation, type PresentedBinding } from './confirmation.js';
import {
  buildDpop,
  type DpopOptions,
  type DpopRuntime,
  rememberProof,
  requestHtu,
  type VerifiedProof,
  verifyDpopProof,
} from './dpop.js';
import { assertChallengeSafe, assertResourceMetadata, GuardError, type GuardErrorCode } from './errors.js';
import { createEventSink, type GuardEvent, type GuardStats } from './events.js';
import { extractBearerToken, type GuardRequest, hasQueryToken, type TokenExtraction } from './extract-token.js';
import { type ForwardOptions, forwardHeaders } from './forward-headers.js';
import { normalizeTyp } from './guard-typ.js';
import { secretToJwk, secretWeakness } from './hmac-secret.js';
import type { InternalTokenIssuer } from './internal-token.js';
import { checkJwsHeader, verifyJwsSignature } from './jws-verify.js';
import { checkJwk, importCheckedKey, type KeyPolicy, kidSlot, pemToJwk, type VerificationKey } from './key-import.js';
import {
  type KeyReloadOutcome,
  type KeySource,
  liveKeySource,
  type RemoteJwksOptions,
  remoteKeySource,
  staticKeySource,
} from './key-source.js';
import { buildMtls, type MtlsOptions, type MtlsRuntime, presentedThumbprint } from './mtls.js';
import { type NamesAll, refuseUnknownOptions } from './option-names.js';
import { type Principal, principalFromClaims } from './principal.js';
import { seconds } from './seconds.js';
import { parseStrictJson } from './strict-json.js';
import { createTokenCache, type TokenCache } from './token-cache.js';

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
const issuerOptionNames = [
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
const jwksOptionNames = [
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

const guardOptionNames = [
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

/**
 * What `authenticate` and `verify` return: a principal, or the error to answer with.
 *
 * @example
 * const result: GuardResult = await guard.verify(token);
 * if (!result.ok) console.log(result.error.code);
 */
export type GuardResult =
  | {
      ok: true;
      principal: Principal;
      /** A fresh DPoP nonce for the client's next proof (`dpop.nonce`), for the `DPoP-Nonce` response header. */
      dpopNonce?: string;
    }
  | { ok: false; error: GuardError };

/**
 * A configured guard.
 *
 * @example
 * const guard: Guard = createGuard(options);
 * const result = await guard.authenticate({ headers: req.headers, url: req.url, method: req.method });
 */
export interface Guard {
  /**
   * Finds the bearer token of a request and verifies it. Never throws for a bad request. With `dpop`
   * set, a request without `method` or `url` is misuse: it rejects with a `TypeError`.
   */
  authenticate(request: GuardRequest): Promise<GuardResult>;
  /**
   * Verifies a token string. Never throws for bad input: a non-string is `token_malformed`. A token
   * string comes with no DPoP proof: with `dpop: { required: true }` every token is refused
   * (`dpop_proof_invalid`); use `authenticate` with the request, whose proof it checks.
   */
  verify(token: string): Promise<GuardResult>;
  /** Checks a principal against requirements, with this guard's realm in the 403 challenge. */
  authorize(principal: Principal, requirements: readonly Requirement[], request?: GuardRequest): AuthorizationResult;
  /**
   * Builds the error this guard answers with for a code (for glue that refuses before verifying),
   * and counts it as a refusal: a `rejected` event, as for any other.
   */
  error(code: GuardErrorCode): GuardError;
  /** Per-reason counters. */
  stats(): GuardStats;
  /** Resolves once configured keys are imported; rejects when one cannot be. */
  ready(): Promise<void>;
  /**
   * Fetches every remote JWKS (or only `issuer`'s) now, past its cached lifetime and the cooldown,
   * with requests sent after this call, and drops the verified tokens cached under a key the new set
   * no longer holds. For a key compromise: once the issuer has withdrawn the key, tokens signed with
   * it are refused at once instead of until the cached set ends (up to `maxTtl`). A failed fetch keeps
   * the keys held, as any failed fetch does. Rejects with a `TypeError` for an issuer not configured.
   */
  refreshKeys(issuer?: string): Promise<readonly KeyRefresh[]>;
  /** The realm of this guard's challenges. */
  readonly realm: string;
  /** The header this guard reads its token from (`authorization`, or the internal token header). */
  readonly tokenHeader: string;
  /**
   * True when the request carries anything this guard reads as a credential: its token header
   * (`Authorization`, or the internal token header), a `DPoP` header where DPoP is on, or, with
   * `allowQueryToken`, an `access_token` query parameter. A request that carries none is anonymous:
   * what the glue's `optional` lets through without a principal. One that carries any, even of
   * another scheme (`Basic`), is verified, and refused when it does not pass.
   */
  carriesCredentials(request: GuardRequest): boolean;
  /**
   * The headers to send upstream for an authenticated caller (see `forwardHeaders`), minted with the
   * guard's `internalTokens` unless `options.issuer` is given. Throws a `TypeError` when neither is.
   */
  forwardHeaders(
    incoming: Readonly<Record<string, string | string[] | undefined>>,
    principal: Principal,
    options: Omit<ForwardOptions, 'issuer'> & { issuer?: InternalTokenIssuer },
  ): Promise<Record<string, string | string[]>>;
}

/**
 * What {@link Guard.refreshKeys} did for one issuer: `fetched` (the set was fetched and taken in),
 * `failed` (the fetch failed or its set was refused: the keys held stay, a `jwks-fetch` event says
 * why), or `configured` (keys given in the options, or a `jwks` function read on every lookup:
 * nothing to fetch; a function's set is read again all the same, so the tokens cached under a key
 * it no longer holds are dropped).
 */
export interface KeyRefresh {
  readonly issuer: string;
  readonly outcome: KeyReloadOutcome;
}

/**
 * True when `value` is a built {@link Guard} rather than options; lets glue accept either.
 *
 * @example
 * const instance = isGuard(input) ? input : createGuard(input);
 */
export function isGuard(value: unknown): value is Guard {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as Guard).authenticate === 'function' &&
    typeof (value as Guard).verify === 'function'
  );
}

const defaultAsymmetric: readonly JwsAlgorithm[] = ['RS256', 'PS256', 'ES256', 'EdDSA', 'Ed25519'];

/** Internal description of one issuer after option checks. */
export interface IssuerRuntime {
  issuer: string;
  algorithms: readonly JwsAlgorithm[];
  keys: KeySource;
  typ: ReadonlySet<string | null> | undefined;
  profile: ClaimProfile;
  rolesClaim: readonly string[];
  crit: readonly string[];
  ready: Promise<void>;
}

/** Everything the verification engine needs, shared by the edge guard and the internal verifier. */
export interface EngineConfig {
  issuers: ReadonlyMap<string, IssuerRuntime>;
  limits: TokenLimits;
  cache: TokenCache | undefined;
  now: () => number;
  emit: (event: GuardEvent) => void;
  /** `typ` values refused whatever an issuer allows (the internal token at the edge). */
  refusedTypes: ReadonlySet<string>;
  /** Builds the principal from verified claims. */
  principal: (claims: Record<string, unknown>, issuer: IssuerRuntime) => Principal;
  errorOptions: { realm: string; resourceMetadata?: string; dpopAlgorithms?: readonly string[]; dpopOnly?: boolean };
  /** DPoP settings, when enabled. */
  dpop?: DpopRuntime;
  /** mTLS certificate-binding settings, when enabled. */
  mtls?: MtlsRuntime;
  /** Clock tolerance for DPoP proofs, in milliseconds. */
  proofToleranceMs: number;
  /** The guard-wide `clockTolerance` in seconds, for principals of no configured issuer. */
  clockTolerance: number;
}

// An optional duration: unset stays unset (no such bound).
// At least a second: 0 would refuse every token (none is issued and used in the same instant).
const optionalSeconds = (value: number | undefined, name: string) =>
  value === undefined ? undefined : seconds(value, name, { min: 1 });

// The claims other options own: a value rule on one would pass tokens those options refuse, or
// refuse every token. (`sub` is free: Kubernetes service accounts are pinned by it.)
const ownedClaims: Readonly<Record<string, string>> = {
  iss: 'issuer',
  aud: 'audience',
  exp: 'maxLifetime',
  nbf: 'clockTolerance',
  iat: 'maxTokenAge',
  cnf: 'dpop and mtls',
};

const isClaimValue = (value: unknown): value is ClaimValue =>
  typeof value === 'string' || typeof value === 'boolean' || (typeof value === 'number' && Number.isFinite(value));

// Checks `claimValues` and gives it as pairs of a claim and its accepted values (a one-value rule
// is a list of one), the shape checkClaims walks per token.
function claimValueRules(value: unknown, where: string): ReadonlyArray<readonly [string, readonly ClaimValue[]]> {
  if (value === undefined) return [];
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new TypeError(`${where}: claimValues must be an object of claim names and accepted values`);
  }
  return Object.entries(value).map(([claim, accepted]) => {
    if (claim === '') throw new TypeError(`${where}: claimValues cannot name an empty claim`);
    // The token parser refuses a `__proto__` member, so no token could meet a rule on it.
    if (claim === '__proto__') throw new TypeError(`${where}: claimValues cannot rule on __proto__ (no token has it)`);
    // Own members only: `constructor` or `toString` are claims a token may carry, not owned ones.
    if (Object.hasOwn(ownedClaims, claim)) {
      throw new TypeError(`${where}: claimValues cannot rule on ${claim} (see ${ownedClaims[claim]})`);
    }
    const list: unknown[] = Array.isArray(accepted) ? accepted : [accepted];
    if (list.length === 0 || !list.every(isClaimValue)) {
      throw new TypeError(
        `${where}: claimValues.${claim} must be a string, a finite number or a boolean, or a non-empty list of them`,
      );
    }
    return [claim, list as ClaimValue[]] as const;
  });
}

const notAudienceClaims: ReadonlySet<string> = new Set([
  'iss',
  'sub',
  'exp',
  'nbf',
  'iat',
  'jti',
  'cnf',
  'scope',
  'scp',
]);

function claimName(value: unknown, name: string): string {
  if (typeof value !== 'string' || value === '') throw new TypeError(`${name} must be a claim name`);
  return value;
}

// A claim name, or a path of member names into nested claims (at most 8 deep: no provider nests roles
// deeper, and a longer path is more likely a string split by mistake).
function claimPath(value: unknown, name: string): readonly string[] {
  if (typeof value === 'string') return Object.freeze([claimName(value, name)]);
  if (
    !Array.isArray(value) ||
    value.length === 0 ||
    value.length > 8 ||
    !value.every((part) => typeof part === 'string' && part !== '')
  ) {
    throw new TypeError(`${name} must be a claim name, or an array of 1 to 8 member names (a path into nested claims)`);
  }
  return Object.freeze([...(value as string[])]);
}

// The deepest JSON nesting a limit may allow: the strict parser recurses once per level, and a few
// thousand levels would overflow the stack (a throw, where verification must return a value).
const maxDepthCeiling = 1000;

const limitNames = ['maxTokenLength', 'maxHeaderLength', 'maxDepth'] as const satisfies readonly (keyof TokenLimits)[];

function checkLimits(limits: Partial<TokenLimits> | undefined): TokenLimits {
  if (limits === undefined) return { ...defaultTokenLimits };
  if (limits === null || typeof limits !== 'object') throw new TypeError('limits must be an object');
  refuseUnknownOptions(limits, limitNames, 'limits');
  const checked = { ...defaultTokenLimits };
  for (const name of limitNames) {
    // An explicit `undefined` means the default, as an absent member does; it never lifts the bound.
    const value = limits[name];
    if (value === undefined) continue;
    const max = name === 'maxDepth' ? maxDepthCeiling : Number.MAX_SAFE_INTEGER;
    if (!Number.isSafeInteger(value) || value < 1 || value > max) {
      throw new TypeError(`limits.${name} must be a whole number from 1 to ${max}`);
    }
    checked[name] = value;
  }
  return checked;
}

// A string, or any iterable of them (an array, a Set). Anything else (a RegExp, a number, a plain
// object) is no list: undefined, so the caller's "is required" error names the option, rather than
// "value is not iterable" from the spread.
function toList(value: string | readonly string[] | undefined): string[] | undefined {
  if (value === undefined) return undefined;
  if (typeof value === 'string') return [value];
  const iterable = value as unknown as { [Symbol.iterator]?: unknown } | null;
  return typeof iterable?.[Symbol.iterator] === 'function' ? [...value] : undefined;
}

/** A local JWKS: the set, or a function returning the current set (see {@link IssuerOptions.jwks}). */
export type LocalJwks = { keys: readonly unknown[] } | (() => { keys: readonly unknown[] });

function staticKeys(
  options: IssuerOptions,
  algorithms: readonly JwsAlgorithm[],
): Promise<VerificationKey[]> | undefined {
  const inputs: Array<Record<string, unknown>> = [];
  let symmetric = false;
  if (options.secret !== undefined) {
    symmetric = true;
    if (!algorithms.every((alg) => alg.startsWith('HS'))) {
      throw new TypeError(`issuer ${options.issuer}: a secret only verifies HS algorithms`);
    }
    // One key, one algorithm (RFC 8725 §3.1): the secret is pinned to its algorithm, so with two listed
    // every token of the second was key_unknown for good, and nothing said so at startup.
    if (algorithms.length !== 1) {
      throw new TypeError(
        `issuer ${options.issuer}: a secret verifies one algorithm; list one (got ${algorithms.join(', ')})`,
      );
    }
    const alg = algorithms[0] as keyof typeof hmacMinimumBytes;
    const jwk = secretToJwk(options.secret);
    // Checked here, where the algorithm is known, so the error names the minimum rather than the
    // bare `weak-key` the key check below would give.
    const weakness = secretWeakness(options.secret, alg);
    if (weakness !== undefined) throw new TypeError(`issuer ${options.issuer}: ${weakness}`);
    inputs.push({ ...jwk, alg });
  }
  for (const input of options.publicKeys ?? []) {
    if (typeof input === 'string') inputs.push(pemToJwk(input));
    else if ('pem' in input && typeof input.pem === 'string') {
      const pem = input as PemKeyInput;
      inputs.push({
        ...pemToJwk(pem.pem),
        ...(pem.kid === undefined ? {} : { kid: pem.kid }),
        ...(pem.alg === undefined ? {} : { alg: pem.alg }),
      });
    } else inputs.push(input as Record<string, unknown>);
  }
  if (options.jwks !== undefined) {
    if (!isPlainObject(options.jwks) || !Array.isArray(options.jwks.keys)) {
      throw new TypeError(`issuer ${options.issuer}: jwks must be { keys: [...] }`);
    }
    for (const key of options.jwks.keys) inputs.push(key as Record<string, unknown>);
  }
  if (inputs.length === 0) return undefined;
  if (symmetric && inputs.length > 1) {
    throw new TypeError(`issuer ${options.issuer}: a secret cannot be combined with other keys`);
  }
  const policy: KeyPolicy = { algorithms, allowSymmetric: symmetric };
  const kids = new Set<string>();
  const checked = inputs.map((input, index) => {
    if (!symmetric && ['d', 'p', 'q', 'dp', 'dq', 'qi', 'k'].some((member) => member in input)) {
      throw new TypeError(`issuer ${options.issuer}: key ${index} holds private or symmetric material`);
    }
    const result = checkJwk(input, policy);
    if (!result.ok) throw new TypeError(`issuer ${options.issuer}: key ${index} refused (${result.reason})`);
    // As in a fetched set: one kid may name a key for two algorithms, never two keys for one.
    if (result.key.kid !== undefined) {
      const slot = kidSlot(result.key.kid, result.key.alg);
      if (kids.has(slot)) throw new TypeError(`issuer ${options.issuer}: duplicate kid ${result.key.kid}`);
      kids.add(slot);
    }
    return result.key;
  });
  return Promise.all(checked.map(importCheckedKey));
}

// The construction-time read of a `jwks` function. Its own error would name no option; as a bad set
// is, a throw here is a TypeError that says which issuer's function failed (the error is its cause).
// Later reads that throw are `keys_unavailable` (see liveKeySource).
function readJwks(read: () => { keys: readonly unknown[] }, options: IssuerOptions) {
  try {
    return read();
  } catch (cause) {
    throw new TypeError(`issuer ${options.issuer}: the jwks function threw when read at construction`, { cause });
  }
}

/**
 * Checks issuer options and builds its runtime. Throws a `TypeError` for bad options.
 *
 * @example
 * const runtime = buildIssuer({ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }, {}, context);
 */
export function buildIssuer(
  options: IssuerOptions,
  defaults: TokenRules,
  context: {
    now: () => number;
    clock: () => number;
    fetch: typeof globalThis.fetch;
    emit: (event: GuardEvent) => void;
    onKeysRetired: (issuer: string) => void;
  },
): IssuerRuntime {
  if (options === null || typeof options !== 'object') throw new TypeError('every issuer must be an options object');
  if (typeof options.issuer !== 'string' || options.issuer.length === 0) {
    throw new TypeError('every issuer needs a non-empty issuer string');
  }
  refuseUnknownOptions(options, issuerOptionNames, `issuer ${options.issuer}`);
  if (options.jwksOptions !== undefined) {
    if (options.jwksOptions === null || typeof options.jwksOptions !== 'object') {
      throw new TypeError(`issuer ${options.issuer}: jwksOptions must be an object`);
    }
    refuseUnknownOptions(options.jwksOptions, jwksOptionNames, `issuer ${options.issuer}: jwksOptions`);
  }
  const algorithms = assertAlgorithms(
    options.algorithms ?? (options.secret !== undefined ? ['HS256'] : defaultAsymmetric),
    `issuer ${options.issuer}: algorithms`,
  );
  const audiences = toList(options.audience ?? defaults.audience);
  if (audiences === undefined || audiences.length === 0 || audiences.some((a) => typeof a !== 'string' || a === '')) {
    throw new TypeError(`issuer ${options.issuer}: an audience is required (aud is always checked)`);
  }
  const typValues = options.typ ?? defaults.typ ?? ['at+jwt'];
  // An empty list would refuse every token, per request.
  if (!Array.isArray(typValues) || typValues.length === 0) {
    throw new TypeError(
      `issuer ${options.issuer}: typ must be a non-empty list (a null in it accepts a token without typ)`,
    );
  }
  const requiredClaims = options.requiredClaims ?? defaults.requiredClaims ?? [];
  // A string would be spread into its letters, each then required of every token.
  if (!Array.isArray(requiredClaims) || requiredClaims.some((name) => typeof name !== 'string' || name === '')) {
    throw new TypeError(`issuer ${options.issuer}: requiredClaims must be a list of claim names`);
  }
  const typ = new Set(typValues.map((value) => (value === null ? null : normalizeTyp(value))));
  const audienceClaim = claimName(
    options.audienceClaim ?? defaults.audienceClaim ?? 'aud',
    `issuer ${options.issuer}: audienceClaim`,
  );
  // Claims with a meaning of their own: read as an audience, a token for anyone would pass as one.
  if (notAudienceClaims.has(audienceClaim)) {
    throw new TypeError(`issuer ${options.issuer}: audienceClaim cannot be ${audienceClaim}`);
  }
  const profile: ClaimProfile = {
    audiences,
    audienceClaim,
    clockTolerance: seconds(options.clockTolerance ?? defaults.clockTolerance ?? 5, 'clockTolerance', { max: 60 }),
    maxTokenAge: optionalSeconds(options.maxTokenAge ?? defaults.maxTokenAge, 'maxTokenAge'),
    maxLifetime: optionalSeconds(options.maxLifetime ?? defaults.maxLifetime, 'maxLifetime'),
    requiredClaims: [...requiredClaims],
    claimValues: claimValueRules(options.claimValues ?? defaults.claimValues, `issuer ${options.issuer}`),
  };
  // A function is read once here, so a bad set is a TypeError at construction as an object's is.
  const liveJwks = typeof options.jwks === 'function' ? options.jwks : undefined;
  const local = staticKeys(
    liveJwks === undefined ? options : { ...options, jwks: readJwks(liveJwks, options) },
    algorithms,
  );
  let keys: KeySource;
  let ready: Promise<void>;
  if (options.jwksUri !== undefined) {
    if (local !== undefined) throw new TypeError(`issuer ${options.issuer}: use either jwksUri or configured keys`);
    if (algorithms.some((alg) => alg.startsWith('HS'))) {
      throw new TypeError(`issuer ${options.issuer}: HS algorithms cannot be used with a remote JWKS`);
    }
    keys = remoteKeySource(
      { ...options.jwksOptions, uri: options.jwksUri },
      { algorithms, allowSymmetric: false },
      { ...context, onKeysRetired: () => context.onKeysRetired(options.issuer) },
    );
    ready = Promise.resolve();
  } else {
    if (local === undefined)
      throw new TypeError(`issuer ${options.issuer}: configure secret, publicKeys, jwks or jwksUri`);
    keys =
      liveJwks === undefined
        ? staticKeySource(local)
        : liveKeySource(
            liveJwks,
            (set) =>
              staticKeys({ ...options, jwks: set as { keys: readonly unknown[] } }, algorithms) ?? Promise.resolve([]),
            () => context.onKeysRetired(options.issuer),
          );
    ready = local.then(() => undefined);
    // Avoid an unhandled rejection before anyone awaits `ready()`; verification reports it instead.
    ready.catch(() => {});
  }
  return {
    issuer: options.issuer,
    algorithms,
    keys,
    typ,
    profile,
    rolesClaim: claimPath(options.rolesClaim ?? defaults.rolesClaim ?? 'roles', `issuer ${options.issuer}: rolesClaim`),
    crit: [...(options.crit ?? defaults.crit ?? [])],
    ready,
  };
}

// A refusal: counted and reported, then answered. A module function rather than a closure made per
// verification, which would cost an allocation on every request, refused or not.
function refuse(
  engine: EngineConfig,
  binding: VerifiedProof | undefined,
  code: GuardErrorCode,
  issuer?: string,
): GuardResult {
  engine.emit({ type: 'rejected', code, ...(issuer === undefined ? {} : { issuer }), at: engine.now() });
  const scheme = binding === undefined ? {} : { scheme: 'DPoP' as const };
  return { ok: false, error: new GuardError(code, { ...engine.errorOptions, ...scheme }) };
}

// Success: a DPoP proof is remembered only now, once its token verified and is bound to its key, so
// requests that authenticate no one never fill the replay memory nor push a real proof id out of it.
async function accept(
  engine: EngineConfig,
  binding: VerifiedProof | undefined,
  principal: Principal,
  issuer: string,
  cached: boolean,
  at: number,
): Promise<GuardResult> {
  if (binding !== undefined) {
    // A proof is only ever verified where DPoP is on, so the runtime is there; fail closed all the
    // same, as with a replay memory that cannot answer.
    const refusal =
      engine.dpop === undefined ? 'dpop_replay_unavailable' : await rememberProof(engine.dpop, binding, engine.now());
    if (refusal !== undefined) return refuse(engine, binding, refusal, issuer);
  }
  // The configured issuer, never `principal.iss`: behind the gateway that is a claim (`orig_iss`).
  engine.emit({ type: 'authenticated', issuer, cached, at });
  return { ok: true, principal };
}

// What the request proved it holds: the DPoP proof's key, and where `mtls` is on, the thumbprint of
// its client certificate, read once and only when a token bound to one asks for it. A token string
// (`verify`) comes with no request, so with no certificate.
function presentedBinding(
  engine: EngineConfig,
  binding: VerifiedProof | undefined,
  request: GuardRequest | undefined,
): PresentedBinding {
  const jkt = binding?.jkt;
  const mtls = engine.mtls;
  if (mtls === undefined) return jkt === undefined ? {} : { jkt };
  let read = false;
  let thumbprint: string | undefined;
  const certificate = () => {
    if (!read) {
      read = true;
      thumbprint = request === undefined ? undefined : presentedThumbprint(mtls, request);
    }
    return thumbprint;
  };
  return jkt === undefined ? { certificate } : { jkt, certificate };
}

// The JWS compact serialization in canonical base64url: three segments of [A-Za-z0-9_-] joined by
// dots, no padding. Anything else is malformed whatever follows, so it is refused before the cache.
const compactJwsAlphabet = /^[A-Za-z0-9_.-]+$/;

/**
 * The verification pipeline, cheapest checks first and every outcome a value:
 * size and alphabet → cache → split and decode (canonical base64url, UTF-8, strict JSON) → issuer by
 * exact `iss` → header (alg, crit, refused parameters, typ) → alg on the issuer's list (before any
 * JWKS fetch) → key by exact `kid` (a configured key without one matches any) → signature → claims →
 * principal → cache (unless the issuer retired a key meanwhile) → DPoP proof remembered.
 * Claims are only read for `iss` (to pick the keys) before the signature has verified.
 *
 * @example
 * const result = await verifyWithEngine(token, engine);
 */
export async function verifyWithEngine(
  token: string,
  engine: EngineConfig,
  binding?: VerifiedProof,
  request?: GuardRequest,
): Promise<GuardResult> {
  // `verify` is documented never to throw for bad input, and JavaScript callers can pass anything.
  if (typeof token !== 'string') return refuse(engine, binding, 'token_malformed');
  if (token.length > engine.limits.maxTokenLength) return refuse(engine, binding, 'token_too_large');
  if (!compactJwsAlphabet.test(token)) return refuse(engine, binding, 'token_malformed');
  // A DPoP-bound result is cached under the token and its key together, apart from bearer results:
  // same token, other key or no proof, no hit.
  const cached = engine.cache?.get(token, binding?.jkt, engine.now());
  const presented = presentedBinding(engine, binding, request);
  if (cached !== undefined) {
    // The cache holds the token, not the connection it came on: a certificate binding is checked on
    // every request, a hit too (the DPoP key is part of the cache key already).
    if (presented.certificate !== undefined) {
      const refusal = checkConfirmation(cached.principal.claims.cnf, presented);
      if (refusal !== undefined) return refuse(engine, binding, refusal, cached.issuer);
    }
    const at = engine.now();
    // A hit starts the refresh a lookup would have started, so the keys behind hits stay current.
    engine.issuers.get(cached.issuer)?.keys.refreshIfDue();
    return accept(engine, binding, cached.principal, cached.issuer, true, at);
  }
  const parsed = parseCompactJws(token, engine.limits);
  if (!parsed.ok) return refuse(engine, binding, parsed.reason === 'too-large' ? 'token_too_large' : 'token_malformed');
  const payloadText = decodeUtf8Strict(parsed.value.payload);
  if (payloadText === undefined) return refuse(engine, binding, 'token_malformed');
  const payloadJson = parseStrictJson(payloadText, engine.limits.maxDepth);
  if (!payloadJson.ok || !isPlainObject(payloadJson.value)) return refuse(engine, binding, 'token_malformed');
  const payload = payloadJson.value;

  const issuerName = payload.iss;
  const issuer = typeof issuerName === 'string' ? engine.issuers.get(issuerName) : undefined;
  if (issuer === undefined) return refuse(engine, binding, 'issuer_unknown');

  const header = checkJwsHeader(parsed.value.header, issuer.crit);
  if (!header.ok) return refuse(engine, binding, header.code, issuer.issuer);
  const { alg, kid, typ } = header.header;
  const normalizedTyp = typ === undefined ? null : normalizeTyp(typ);
  if (normalizedTyp !== null && engine.refusedTypes.has(normalizedTyp))
    return refuse(engine, binding, 'type_invalid', issuer.issuer);
  if (issuer.typ !== undefined && !issuer.typ.has(normalizedTyp))
    return refuse(engine, binding, 'type_invalid', issuer.issuer);
  // An ID token presented as an access token (RFC 8725 §3.12): refused even where `typ` is lax.
  if (normalizedTyp !== 'at+jwt' && payload.nonce !== undefined)
    return refuse(engine, binding, 'type_invalid', issuer.issuer);
  if (!issuer.algorithms.includes(alg)) return refuse(engine, binding, 'algorithm_not_allowed', issuer.issuer);

  // Read before the lookup: a refresh that retires a key while this verification still holds the old
  // set (a lookup answered, the signature check not finished) moves it, and the result is not cached.
  const epoch = engine.cache?.epoch(issuer.issuer) ?? 0;
  let lookup: Awaited<ReturnType<KeySource['lookup']>>;
  try {
    lookup = await issuer.keys.lookup(kid, alg);
  } catch {
    return refuse(engine, binding, 'keys_unavailable', issuer.issuer);
  }
  if (lookup.kind === 'unknown-kid') return refuse(engine, binding, 'key_unknown', issuer.issuer);
  if (lookup.kind === 'alg-mismatch') return refuse(engine, binding, 'algorithm_not_allowed', issuer.issuer);
  if (lookup.kind === 'unavailable') return refuse(engine, binding, 'keys_unavailable', issuer.issuer);

  let signature = await verifyJwsSignature(parsed.value, alg, lookup.keys);
  if (!signature.ok && signature.code === 'signature_invalid' && issuer.keys.recheck !== undefined) {
    // New material under a known kid (a replaced key) would otherwise be refused until the cached set
    // expires, up to a day; the source refetches once per cooldown, as for an unknown kid.
    const untried = await issuer.keys.recheck(kid, alg, lookup.keys).catch(() => undefined);
    if (untried) signature = await verifyJwsSignature(parsed.value, alg, untried);
  }
  if (!signature.ok) return refuse(engine, binding, signature.code, issuer.issuer);

  const nowMs = engine.now();
  const claimError = checkClaims(payload, issuer.profile, nowMs, presented);
  if (claimError !== undefined) return refuse(engine, binding, claimError, issuer.issuer);

  const principal = engine.principal(payload, issuer);
  if (engine.cache !== undefined) {
    let expiresAt = (payload.exp as number) * 1000;
    if (issuer.profile.maxTokenAge !== undefined) {
      expiresAt = Math.min(expiresAt, ((payload.iat as number) + issuer.profile.maxTokenAge) * 1000);
    }
    engine.cache.set(token, binding?.jkt, principal, expiresAt, issuer.issuer, epoch);
  }
  return accept(engine, binding, principal, issuer.issuer, false, nowMs);
}

/** Builds the shared engine pieces from guard-level options. */
export function buildEngine(
  options: Omit<GuardOptions, 'issuers'> & { issuers: readonly IssuerOptions[] },
  overrides: {
    refusedTypes: ReadonlySet<string>;
    principal?: (claims: Record<string, unknown>, issuer: IssuerRuntime) => Principal;
  },
): { engine: EngineConfig; stats: () => GuardStats; realm: string } {
  if (!Array.isArray(options.issuers) || options.issuers.length === 0) {
    throw new TypeError('issuers must list at least one trusted issuer');
  }
  const realm = options.realm ?? 'api';
  assertChallengeSafe(realm, 'realm');
  // It goes to every client in WWW-Authenticate: a password in it would be handed to anyone who asks.
  if (options.resourceMetadata !== undefined) assertResourceMetadata(options.resourceMetadata);
  const now = options.now ?? Date.now;
  // Either would only fail at the first request, as a 500 or as every JWKS fetch failing.
  if (typeof now !== 'function') throw new TypeError('now must be a function returning epoch milliseconds');
  // Key sets' lifetimes and cooldowns are intervals: measured on a monotonic clock, a wall clock set
  // back (NTP, a VM resumed) cannot hold a set fresh or an on-demand fetch back. An injected `now`
  // drives both, so tests step one clock.
  const clock = options.now ?? (() => performance.now());
  if (options.fetch !== undefined && typeof options.fetch !== 'function')
    throw new TypeError('fetch must be a function');
  const sink = createEventSink(options.onEvent);
  const issuers = new Map<string, IssuerRuntime>();
  if (options.cache !== undefined && options.cache !== false) {
    if (options.cache === null || typeof options.cache !== 'object')
      throw new TypeError('cache must be false or an object');
    refuseUnknownOptions(options.cache, ['maxEntries'], 'cache');
  }
  const cache =
    options.cache === false
      ? undefined
      : createTokenCache(options.cache?.maxEntries ?? 10_000, (issuer) => issuers.get(issuer)?.keys.usable() ?? false);
  const limits = checkLimits(options.limits);
  const fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  const dpop = options.dpop === undefined ? undefined : buildDpop(options.dpop, now);
  const mtls = options.mtls === undefined ? undefined : buildMtls(options.mtls);
  const proofTolerance = options.clockTolerance ?? 5;
  if (!Number.isFinite(proofTolerance) || proofTolerance < 0 || proofTolerance > 60) {
    throw new TypeError('clockTolerance must be a number of seconds between 0 and 60');
  }
  for (const issuerOptions of options.issuers) {
    if (issuers.has(issuerOptions.issuer)) throw new TypeError(`issuer ${issuerOptions.issuer} is listed twice`);
    issuers.set(
      issuerOptions.issuer,
      buildIssuer(issuerOptions, options, {
        now,
        clock,
        fetch: fetchImpl,
        emit: sink.emit,
        onKeysRetired: (issuer) => cache?.deleteIssuer(issuer),
      }),
    );
  }
  const engine: EngineConfig = {
    issuers,
    limits,
    cache,
    now,
    emit: sink.emit,
    refusedTypes: overrides.refusedTypes,
    principal:
      overrides.principal ??
      ((claims, issuer) =>
        principalFromClaims(claims, { rolesClaim: issuer.rolesClaim, audienceClaim: issuer.profile.audienceClaim })),
    errorOptions: {
      realm,
      ...(options.resourceMetadata === undefined ? {} : { resourceMetadata: options.resourceMetadata }),
      ...(dpop === undefined ? {} : { dpopAlgorithms: dpop.algorithms, dpopOnly: dpop.required }),
    },
    ...(dpop === undefined ? {} : { dpop }),
    ...(mtls === undefined ? {} : { mtls }),
    proofToleranceMs: proofTolerance * 1000,
    clockTolerance: proofTolerance,
  };
  return { engine, stats: sink.stats, realm };
}

/**
 * The `typ` of the gateway's internal token; the edge guard refuses it whatever an issuer allows.
 *
 * @example
 * internalTokenType; // 'internal+jwt'
 */
export const internalTokenType = 'internal+jwt';

/**
 * Builds a guard that verifies access tokens at the edge (spec part 5).
 *
 * The default profile: `exp`, `aud`, `sub` required; `iss` matched exactly against the configured
 * issuers, each with its own keys; `nbf` honoured; an `iat` in the future refused; 5 s clock tolerance
 * (60 s at most); `typ` must be `at+jwt`; algorithms pinned per issuer and per key; `crit` refused
 * unless listed; `jku`/`x5u`/`jwk` headers refused; strict parsing with size limits; verified tokens
 * cached by SHA-256 until `exp`, and only while their issuer's keys can be trusted.
 *
 * @example
 * const guard = createGuard({
 *   audience: 'https://api.example',
 *   issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/.well-known/jwks.json' }],
 * });
 * // The method and URL too: a DPoP proof is checked against them (with `dpop` set, a call without them is a TypeError).
 * const result = await guard.authenticate({ headers: req.headers, url: req.url, method: req.method });
 * if (!result.ok) res.writeHead(result.error.status, { 'www-authenticate': result.error.wwwAuthenticate });
 */
export function createGuard(options: GuardOptions): Guard {
  if (options === null || typeof options !== 'object') throw new TypeError('createGuard needs options');
  refuseUnknownOptions(options, guardOptionNames, 'createGuard');
  const { engine, stats, realm } = buildEngine(options, { refusedTypes: new Set([internalTokenType]) });
  const allowQueryToken = options.allowQueryToken === true;
  const dpopMode = engine.dpop === undefined ? 'off' : engine.dpop.required ? 'required' : 'allowed';
  // A query token is a bearer token (RFC 6750 §2.3; RFC 9449 defines no query form), which
  // `dpop.required` refuses: together, the option did nothing but make an `optional` route refuse a
  // request carrying one, instead of serving it as anonymous.
  if (allowQueryToken && dpopMode === 'required') {
    throw new TypeError(
      'allowQueryToken cannot be combined with dpop.required: a query token is a bearer token, which dpop.required refuses',
    );
  }
  return guardFromEngine(
    engine,
    stats,
    realm,
    'authorization',
    (request) =>
      extractBearerToken(request, { allowQueryToken, maxLength: engine.limits.maxTokenLength, dpop: dpopMode }),
    options.internalTokens,
    (request) =>
      present(request.headers.authorization) ||
      (dpopMode !== 'off' && present(request.headers.dpop)) ||
      (allowQueryToken && hasQueryToken(request.url)),
  );
}

// A header counts as sent when it is there at all, even empty: `Authorization:` is a credential
// that fails, not an anonymous request.
const present = (value: string | readonly string[] | undefined) => value !== undefined;

const noRequest: GuardRequest = Object.freeze({ headers: Object.freeze({}) });

const isRequestLike = (value: unknown): value is GuardRequest =>
  typeof value === 'object' &&
  value !== null &&
  typeof (value as GuardRequest).headers === 'object' &&
  (value as GuardRequest).headers !== null;

/**
 * Wraps an engine as a {@link Guard} reading tokens with `extract`; `carries` tells whether a request
 * carries a credential at all (by default: whether it has the `tokenHeader`).
 *
 * @example
 * const guard = guardFromEngine(engine, stats, 'api', 'x-token', (request) => extractHeaderToken(request, 'x-token', 8192));
 */
export function guardFromEngine(
  engine: EngineConfig,
  stats: () => GuardStats,
  realm: string,
  tokenHeader: string,
  extract: (request: GuardRequest) => TokenExtraction,
  internalTokens?: InternalTokenIssuer,
  carries: (request: GuardRequest) => boolean = (request) => present(request.headers[tokenHeader]),
): Guard {
  const error = (code: GuardErrorCode) => {
    engine.emit({ type: 'rejected', code, at: engine.now() });
    return new GuardError(code, engine.errorOptions);
  };
  // Authorization refusals carry what every other challenge of this guard carries (realm, RFC 9728
  // resource_metadata, the DPoP offer); built once, not per call.
  const authorizeOptions = { ...engine.errorOptions, now: engine.now };
  // An `auth_time` (ahead of the clock, or past `maxAge`) gets the skew its issuer's `exp`/`nbf`/`iat`
  // get. Behind the gateway `iss` is the original issuer, which the internal verifier does not list:
  // the guard-wide value then.
  const clockTolerance = (principal: Principal) =>
    engine.issuers.get(principal.iss)?.profile.clockTolerance ?? engine.clockTolerance;
  return {
    realm,
    tokenHeader,
    carriesCredentials(input) {
      return isRequestLike(input) && carries(input);
    },
    async authenticate(input) {
      // Never a throw for a bad request: no request or no header map reads as a request without a token.
      const request = isRequestLike(input) ? input : noRequest;
      // A DPoP proof is bound to the method (`htm`) and the URL (`htu`). Read as a GET's when missing, a
      // POST's own proof was refused and a GET's proof taken on a POST; a missing URL read as `/` let a
      // proof for the root pass on any path. Checked on every request, bearer ones too, so a call that
      // forgets them fails on the first request in development, not on the first DPoP client.
      const method = request.method;
      if (engine.dpop !== undefined && request !== noRequest) {
        if (typeof method !== 'string' || method === '') {
          throw new TypeError(
            'authenticate needs request.method when the guard has dpop: a DPoP proof is checked against it (htm)',
          );
        }
        if (typeof request.url !== 'string' || request.url === '') {
          throw new TypeError(
            'authenticate needs request.url when the guard has dpop: a DPoP proof is checked against it (htu)',
          );
        }
      }
      const found = extract(request);
      if (!found.ok) {
        engine.emit({ type: 'rejected', code: found.code, at: engine.now() });
        const scheme = found.scheme === undefined ? {} : { scheme: found.scheme };
        return { ok: false, error: new GuardError(found.code, { ...engine.errorOptions, ...scheme }) };
      }
      // `method` is a string here: checked above for any request-like input, and a non-request carries no proof.
      if (found.scheme === 'DPoP' && engine.dpop !== undefined && found.proof !== undefined && method !== undefined) {
        const proof = await verifyDpopProof(found.proof, engine.dpop, {
          method,
          url: requestHtu(engine.dpop, request),
          accessToken: found.token,
          nowMs: engine.now(),
          clockToleranceMs: engine.proofToleranceMs,
          limits: engine.limits,
        });
        const nonces = engine.dpop.nonces;
        if (!proof.ok) {
          engine.emit({ type: 'rejected', code: proof.code, at: engine.now() });
          // RFC 9449 §9: the refusal for a missing or stale nonce brings the one to use.
          const nonce =
            proof.code === 'dpop_nonce_required' && nonces !== undefined
              ? { dpopNonce: nonces.current(engine.now()) }
              : {};
          return { ok: false, error: new GuardError(proof.code, { ...engine.errorOptions, scheme: 'DPoP', ...nonce }) };
        }
        const result = await verifyWithEngine(found.token, engine, proof, request);
        // A nonce of the last window still passes; the answer brings the current one, so the
        // client's next proof does not meet a refusal when the last window is gone.
        if (result.ok && proof.renewNonce && nonces !== undefined) {
          return { ...result, dpopNonce: nonces.current(engine.now()) };
        }
        return result;
      }
      return verifyWithEngine(found.token, engine, undefined, request);
    },
    verify(token) {
      // `dpop: { required: true }` refuses bearer use, and a token string comes with no proof: every
      // token is refused, as a request without one is. Unbound tokens passed here before, the one
      // kind the option exists to refuse (a bound one was token_bound).
      if (engine.dpop?.required === true) {
        return Promise.resolve({ ok: false, error: error('dpop_proof_invalid') });
      }
      return verifyWithEngine(token, engine);
    },
    authorize(principal, requirements, request) {
      const decision = authorizeRequest(principal, requirements, request ?? { headers: {} }, {
        ...authorizeOptions,
        clockTolerance: clockTolerance(principal),
      });
      // A 403 (or a step-up 401) is a refusal like a bad token's: told to onEvent and counted, or an
      // operator asking why clients get 403 finds only successes.
      if (!decision.ok) {
        const issuer = principal.iss === '' ? {} : { issuer: principal.iss };
        engine.emit({ type: 'rejected', code: decision.error.code, ...issuer, at: engine.now() });
      }
      return decision;
    },
    error,
    stats,
    async forwardHeaders(incoming, principal, options) {
      const issuer = options.issuer ?? internalTokens;
      if (issuer === undefined) {
        throw new TypeError(
          'forwardHeaders needs an internal token issuer: set internalTokens on the guard or pass issuer',
        );
      }
      return forwardHeaders(incoming, principal, { ...options, issuer }) as Promise<Record<string, string | string[]>>;
    },
    async ready() {
      await Promise.all([...engine.issuers.values()].map((issuer) => issuer.ready));
    },
    async refreshKeys(only) {
      const chosen = only === undefined ? [...engine.issuers.values()] : [engine.issuers.get(only)];
      return Promise.all(
        chosen.map(async (issuer): Promise<KeyRefresh> => {
          if (issuer === undefined) throw new TypeError(`refreshKeys: issuer ${String(only)} is not configured`);
          const outcome = issuer.keys.reload === undefined ? 'configured' : await issuer.keys.reload();
          return { issuer: issuer.issuer, outcome };
        }),
      );
    },
  };
}
