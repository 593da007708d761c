import { assertAlgorithms, type JwsAlgorithm } from './algorithms.js';
import type { ClaimProfile } from './claims.js';
import type { GuardEvent } from './events.js';
import { type IssuerOptions, issuerOptionNames, jwksOptionNames, type TokenRules } from './guard-options.js';
import { normalizeTyp } from './guard-typ.js';
import { type KeySource, liveKeySource, remoteKeySource, staticKeySource } from './key-source.js';
import { claimName, claimPath, claimValueRules, notAudienceClaims, optionalSeconds, toList } from './option-checks.js';
import { refuseUnknownOptions } from './option-names.js';
import { seconds } from './seconds.js';
import { readJwks, staticKeys } from './static-keys.js';

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
