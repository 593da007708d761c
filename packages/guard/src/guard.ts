import { type AuthorizationResult, authorizeRequest, type Requirement } from './authorization.js';
import { requestHtu, verifyDpopProof } from './dpop.js';
import { buildEngine, type EngineConfig } from './engine.js';
import { GuardError, type GuardErrorCode } from './errors.js';
import type { GuardStats } from './events.js';
import { extractBearerToken, type GuardRequest, hasQueryToken, type TokenExtraction } from './extract-token.js';
import { type ForwardOptions, forwardHeaders } from './forward-headers.js';
import { type GuardOptions, guardOptionNames } from './guard-options.js';
import { internalTokenType } from './guard-typ.js';
import type { InternalTokenIssuer } from './internal-token-issuer.js';
import type { KeyReloadOutcome } from './key-source.js';
import { refuseUnknownOptions } from './option-names.js';
import type { Principal } from './principal.js';
import { type GuardResult, verifyWithEngine } from './verify.js';

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
