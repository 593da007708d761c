import type { TokenLimits } from './compact-jws.js';
import { buildDpop, type DpopRuntime } from './dpop.js';
import { assertChallengeSafe, assertResourceMetadata } from './errors.js';
import { createEventSink, type GuardEvent, type GuardStats } from './events.js';
import type { GuardOptions, IssuerOptions } from './guard-options.js';
import { buildIssuer, type IssuerRuntime } from './issuer.js';
import { buildMtls, type MtlsRuntime } from './mtls.js';
import { checkLimits } from './option-checks.js';
import { refuseUnknownOptions } from './option-names.js';
import { type Principal, principalFromClaims } from './principal.js';
import { createTokenCache, type TokenCache } from './token-cache.js';

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
