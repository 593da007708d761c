/**
 * Every error code the guard produces, the HTTP status it maps to, the RFC 6750 `error` value of the
 * challenge, and the fixed `error_description`. Descriptions are written here once and never built from
 * input: a token, a claim or a header value can never end up in a response (research case 54).
 *
 * `error: undefined` means the challenge carries no `error` attribute, as RFC 6750 §3.1 asks when the
 * request had no credentials at all.
 *
 * @example
 * guardErrorTable.token_expired.status; // 401
 */
export const guardErrorTable = {
  token_missing: {
    status: 401,
    error: undefined,
    title: 'Authentication required',
    description: 'No bearer token was presented',
  },
  multiple_tokens: {
    status: 400,
    error: 'invalid_request',
    title: 'More than one token was presented',
    description: 'The request presented more than one access token',
  },
  authorization_malformed: {
    status: 400,
    error: 'invalid_request',
    title: 'Malformed Authorization header',
    description: 'The Authorization header is not a well-formed Bearer credential',
  },
  token_too_large: {
    status: 400,
    error: 'invalid_request',
    title: 'Access token too large',
    description: 'The access token exceeds the size limit',
  },
  token_malformed: {
    status: 401,
    error: 'invalid_token',
    title: 'Malformed access token',
    description: 'The access token is malformed',
  },
  header_unsupported: {
    status: 401,
    error: 'invalid_token',
    title: 'Unsupported token header',
    description: 'The access token uses a header parameter that is not accepted',
  },
  type_invalid: {
    status: 401,
    error: 'invalid_token',
    title: 'Wrong token type',
    description: 'The token type is not accepted here',
  },
  algorithm_not_allowed: {
    status: 401,
    error: 'invalid_token',
    title: 'Signing algorithm not allowed',
    description: 'The signing algorithm of the access token is not accepted',
  },
  issuer_unknown: {
    status: 401,
    error: 'invalid_token',
    title: 'Untrusted issuer',
    description: 'The access token issuer is not trusted',
  },
  key_unknown: {
    status: 401,
    error: 'invalid_token',
    title: 'Unknown signing key',
    description: 'No signing key is known for the access token',
  },
  keys_unavailable: {
    status: 401,
    error: 'invalid_token',
    title: 'Signing keys unavailable',
    description: 'The signing keys of the issuer could not be retrieved',
  },
  signature_invalid: {
    status: 401,
    error: 'invalid_token',
    title: 'Invalid signature',
    description: 'The access token signature is invalid',
  },
  token_expired: {
    status: 401,
    error: 'invalid_token',
    title: 'Access token expired',
    description: 'The access token expired',
  },
  token_not_yet_valid: {
    status: 401,
    error: 'invalid_token',
    title: 'Access token not yet valid',
    description: 'The access token is not valid yet',
  },
  token_issued_in_future: {
    status: 401,
    error: 'invalid_token',
    title: 'Access token issued in the future',
    description: 'The access token was issued in the future',
  },
  token_too_old: {
    status: 401,
    error: 'invalid_token',
    title: 'Access token too old',
    description: 'The access token is older than the accepted maximum age',
  },
  lifetime_too_long: {
    status: 401,
    error: 'invalid_token',
    title: 'Access token lifetime too long',
    description: 'The access token lifetime exceeds the accepted maximum',
  },
  audience_invalid: {
    status: 401,
    error: 'invalid_token',
    title: 'Wrong audience',
    description: 'The access token is not meant for this audience',
  },
  claim_invalid: {
    status: 401,
    error: 'invalid_token',
    title: 'Invalid claims',
    description: 'A required claim of the access token is missing or invalid',
  },
  token_bound: {
    status: 401,
    error: 'invalid_token',
    title: 'Sender-constrained token',
    description: 'A sender-constrained token cannot be used as a bearer token',
  },
  dpop_proof_invalid: {
    status: 401,
    error: 'invalid_dpop_proof',
    title: 'Invalid DPoP proof',
    description: 'The DPoP proof is missing or invalid',
  },
  dpop_proof_replayed: {
    status: 401,
    error: 'invalid_dpop_proof',
    title: 'DPoP proof replayed',
    description: 'The DPoP proof was already used',
  },
  dpop_replay_full: {
    status: 401,
    error: 'invalid_dpop_proof',
    title: 'DPoP replay memory full',
    description: 'The DPoP proof cannot be accepted now: the replay memory is full',
  },
  // Apart from `dpop_replay_full` though the client's remedy is the same (retry later with a fresh
  // proof): the operator's is not. Full means the memory is too small for the traffic; this means one
  // proof key sent more proofs in one window than its share (`dpop.maxReplayEntriesPerKey`), a client
  // to look at or a share to raise, and the other clients were not affected.
  dpop_replay_share_full: {
    status: 401,
    error: 'invalid_dpop_proof',
    title: 'DPoP replay share full',
    description: 'The DPoP proof cannot be accepted now: this key has too many recent proofs',
  },
  // RFC 9449 §9: the proof carries no nonce, or one this server no longer takes. The answer brings
  // the current one in `DPoP-Nonce` (the glue sends `GuardError.dpopNonce`), for the client's retry.
  dpop_nonce_required: {
    status: 401,
    error: 'use_dpop_nonce',
    title: 'DPoP nonce required',
    description: 'The DPoP proof must carry the nonce this server provides',
  },
  // A 401 like `keys_unavailable`: a dependency that is down refuses the request, fails closed, and
  // tells operators through its counter rather than telling clients with a 503.
  dpop_replay_unavailable: {
    status: 401,
    error: 'invalid_dpop_proof',
    title: 'DPoP replay memory unavailable',
    description: 'The DPoP proof cannot be accepted now: the replay memory is unavailable',
  },
  token_binding_invalid: {
    status: 401,
    error: 'invalid_token',
    title: 'Token not bound to the DPoP key',
    description: 'The access token is not bound to the key of the DPoP proof',
  },
  // RFC 8705 §3: a certificate-bound token from a request with no client certificate (or none that
  // parses), or with another one than it is bound to. Two codes, as the remedies differ: configure
  // the client (or the proxy passing its certificate on) to present one, or use the right one.
  certificate_missing: {
    status: 401,
    error: 'invalid_token',
    title: 'Client certificate required',
    description: 'The access token is bound to a client certificate and none was presented',
  },
  certificate_mismatch: {
    status: 401,
    error: 'invalid_token',
    title: 'Wrong client certificate',
    description: 'The access token is bound to another client certificate',
  },
  insufficient_user_authentication: {
    status: 401,
    error: 'insufficient_user_authentication',
    title: 'Stronger authentication required',
    description: 'A more recent or stronger user authentication is required',
  },
  insufficient_scope: {
    status: 403,
    error: 'insufficient_scope',
    title: 'Insufficient privileges',
    description: 'The access token lacks the privileges this request needs',
  },
} as const;

/**
 * A stable guard error code; callers match on it, never on messages.
 *
 * @example
 * if (error.code === ('token_expired' satisfies GuardErrorCode)) refreshToken();
 */
export type GuardErrorCode = keyof typeof guardErrorTable;

/** Base of the RFC 9457 `type` URIs, shared with the rest of idem. */
const problemTypeBase = 'https://idem.dev/problems/';

/** Characters RFC 6750 §3 allows inside a quoted `realm`, `error_description` or `scope`. */
const challengeSafe = /^[\x20\x21\x23-\x5B\x5D-\x7E]*$/;

/** A scope token per RFC 6749 §3.3: printable ASCII without space, `"` and `\`. */
const scopeToken = /^[\x21\x23-\x5B\x5D-\x7E]+$/;

/**
 * Throws a `TypeError` unless `value` can be placed inside a quoted challenge attribute. Used at
 * construction for configured realms, scopes and URLs, so a response never needs escaping.
 *
 * @example
 * assertChallengeSafe('api', 'realm'); // ok
 */
export function assertChallengeSafe(value: string, name: string): void {
  if (typeof value !== 'string' || !challengeSafe.test(value)) {
    throw new TypeError(`${name} must be printable ASCII without '"' or '\\'`);
  }
}

/**
 * Throws a `TypeError` unless `value` can be a challenge's `resource_metadata`: challenge-safe, and
 * no user name or password in it, since it goes to every client (its query stays: the address clients
 * fetch is a public one). The message never quotes the value.
 *
 * @example
 * assertResourceMetadata('https://api.example/.well-known/oauth-protected-resource'); // ok
 */
export function assertResourceMetadata(value: string): void {
  assertChallengeSafe(value, 'resourceMetadata');
  const url = URL.canParse(value) ? new URL(value) : undefined;
  if (url !== undefined && (url.username !== '' || url.password !== '')) {
    throw new TypeError('resourceMetadata must not hold a user name or password: it is sent to every client');
  }
}

/**
 * Throws a `TypeError` unless `value` is an RFC 6749 scope token.
 *
 * @example
 * assertScopeToken('orders:write', 'scope'); // ok
 */
export function assertScopeToken(value: string, name: string): void {
  if (typeof value !== 'string' || !scopeToken.test(value)) {
    throw new TypeError(`${name} must be a scope token (printable ASCII, no spaces, quotes or backslashes)`);
  }
}

/**
 * Options of a {@link GuardError}.
 *
 * @example
 * new GuardError('insufficient_scope', { realm: 'orders', scope: ['orders:write'] });
 */
export interface GuardErrorOptions {
  /** The `realm` of the challenge (default `api`). Configured, never taken from a request. */
  realm?: string | undefined;
  /** Scopes named in an `insufficient_scope` challenge. Configured, never taken from a request. */
  scope?: readonly string[] | undefined;
  /** RFC 9728 protected-resource metadata URL added to the challenge. */
  resourceMetadata?: string | undefined;
  /** RFC 9470 step-up: the authentication context classes that would satisfy the request. */
  acrValues?: readonly string[] | undefined;
  /** RFC 9470 step-up: the maximum authentication age in seconds. */
  maxAge?: number | undefined;
  /** The scheme the client used (`DPoP` answers with a DPoP challenge, RFC 9449 §7.1). */
  scheme?: 'Bearer' | 'DPoP' | undefined;
  /** Proof algorithms when DPoP is enabled; a 401 then also offers a `DPoP` challenge. */
  dpopAlgorithms?: readonly string[] | undefined;
  /** DPoP required: only the `DPoP` challenge is offered. */
  dpopOnly?: boolean | undefined;
  /** The underlying failure, for logs; never sent to a client. */
  cause?: unknown;
  /** A DPoP nonce for the client's next proof, sent in the `DPoP-Nonce` response header (RFC 9449 §9). */
  dpopNonce?: string | undefined;
}

/**
 * The RFC 9457 body of a guard error.
 *
 * @example
 * const body: GuardProblem = error.toProblem();
 */
export interface GuardProblem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: GuardErrorCode;
  /**
   * True where the same token may pass later: `keys_unavailable` (once the issuer's keys can be
   * fetched), `dpop_replay_full`, `dpop_replay_share_full` and `dpop_replay_unavailable` (with a
   * fresh proof, once the replay memory has room or answers again).
   */
  retryable: boolean;
  [extension: string]: unknown;
}

/**
 * The one error of the guard. It is returned (not thrown) by `authenticate`, `verify` and
 * `authorizeRequest`; an adapter answers it with {@link GuardError.status},
 * `WWW-Authenticate: {@link GuardError.wwwAuthenticate}` and the body of {@link GuardError.toProblem}.
 *
 * @example
 * const error = new GuardError('token_expired', { realm: 'orders' });
 * error.status; // 401
 * error.wwwAuthenticate; // 'Bearer realm="orders", error="invalid_token", error_description="The access token expired"'
 */
export class GuardError extends Error {
  override readonly name = 'GuardError' as const;
  readonly code: GuardErrorCode;
  readonly status: 400 | 401 | 403;
  /**
   * Whether the same request (same token) can succeed later: true for `keys_unavailable`,
   * `dpop_replay_full`, `dpop_replay_share_full` and `dpop_replay_unavailable`, refusals about the server's own dependencies
   * (the issuer's key endpoint, the replay memory), not the token. Every other refusal is repeated.
   */
  readonly retryable: boolean;
  /** The complete `WWW-Authenticate` header value (RFC 6750 §3). */
  readonly wwwAuthenticate: string;
  /**
   * The nonce the client must put in its next DPoP proof, for the `DPoP-Nonce` response header
   * (RFC 9449 §9): set on `dpop_nonce_required`, undefined otherwise.
   */
  readonly dpopNonce: string | undefined;

  constructor(code: GuardErrorCode, options: GuardErrorOptions = {}) {
    const row = guardErrorTable[code];
    super(row.description, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.status = row.status;
    this.retryable = retryableCodes.has(code);
    this.wwwAuthenticate = buildChallenge(row.error, row.description, row.status, options);
    this.dpopNonce = options.dpopNonce;
  }

  /** The RFC 9457 problem details body (`application/problem+json`). */
  toProblem(): GuardProblem {
    const row = guardErrorTable[this.code];
    return {
      type: problemTypeBase + this.code.replaceAll('_', '-'),
      title: row.title,
      status: this.status,
      detail: row.description,
      code: this.code,
      retryable: this.retryable,
    };
  }
}

// The refusals a later attempt with the same token may pass: the guard fails closed while the issuer's
// keys cannot be fetched, or while the replay memory is full or down, and the token itself may be fine.
// (A DPoP retry brings a fresh proof, as every DPoP request does; a replayed proof stays final.)
// No `Retry-After`: RFC 9110 §10.2.3 gives it a meaning for 503 and 3xx, and these are 401s.
const retryableCodes: ReadonlySet<GuardErrorCode> = new Set([
  'keys_unavailable',
  'dpop_replay_full',
  'dpop_replay_share_full',
  'dpop_replay_unavailable',
]);

function buildChallenge(
  error: string | undefined,
  description: string,
  status: number,
  { realm = 'api', scope, resourceMetadata, scheme, dpopAlgorithms, dpopOnly, acrValues, maxAge }: GuardErrorOptions,
): string {
  // Every value below is either from the fixed table or validated configuration: nothing to escape.
  assertChallengeSafe(realm, 'realm');
  const dpop = dpopAlgorithms !== undefined && dpopAlgorithms.length > 0;
  const algs = dpop ? `, algs="${dpopAlgorithms.join(' ')}"` : '';
  // The challenge answers in the scheme the client used; proof errors are always DPoP's (RFC 9449 §7.1).
  const primary =
    error === 'invalid_dpop_proof' || error === 'use_dpop_nonce' || scheme === 'DPoP' || (dpop && dpopOnly === true)
      ? 'DPoP'
      : 'Bearer';
  let challenge = `${primary} realm="${realm}"`;
  if (error !== undefined) challenge += `, error="${error}", error_description="${description}"`;
  if (scope !== undefined && scope.length > 0) {
    for (const item of scope) assertScopeToken(item, 'scope');
    challenge += `, scope="${scope.join(' ')}"`;
  }
  if (acrValues !== undefined && acrValues.length > 0) {
    for (const item of acrValues) assertScopeToken(item, 'acrValues');
    challenge += `, acr_values="${acrValues.join(' ')}"`;
  }
  if (maxAge !== undefined) {
    if (!Number.isSafeInteger(maxAge) || maxAge < 0) throw new TypeError('maxAge must be a whole number of seconds');
    challenge += `, max_age="${maxAge}"`;
  }
  if (resourceMetadata !== undefined) {
    assertResourceMetadata(resourceMetadata);
    challenge += `, resource_metadata="${resourceMetadata}"`;
  }
  if (primary === 'DPoP') return challenge + algs;
  // Both schemes accepted: a 401 offers DPoP next to Bearer, so a DPoP-capable client can upgrade.
  if (dpop && status === 401) challenge += `, DPoP realm="${realm}"${algs}`;
  return challenge;
}

/**
 * True when `value` is a {@link GuardError}, also across copies of the package.
 *
 * @example
 * if (isGuardError(result.error)) console.log(result.error.code);
 */
export function isGuardError(value: unknown): value is GuardError {
  return value instanceof Error && value.name === 'GuardError' && typeof (value as GuardError).code === 'string';
}
