import type { GuardErrorCode } from './errors.js';

/**
 * The request shape the guard reads: a header map (Node's, or `headersDistinct`) and the URL.
 *
 * @example
 * const request: GuardRequest = { headers: { authorization: 'Bearer ...' }, url: '/orders', method: 'POST' };
 */
export interface GuardRequest {
  headers: Record<string, string | string[] | undefined>;
  // `| undefined` spelt out: Node's IncomingMessage declares them so, and under
  // exactOptionalPropertyTypes a request must be accepted as it is.
  /** The request target (path and query); a DPoP proof's `htu` is checked against it. Required when the guard has `dpop` (else a `TypeError`). */
  url?: string | undefined;
  /** The request method; a DPoP proof's `htm` is checked against it. Required when the guard has `dpop` (else a `TypeError`). */
  method?: string | undefined;
  /** Route parameters, when the framework has them (for attribute policies). */
  params?: unknown;
  /**
   * The connection the request came on (Node's `req.socket`), for the TLS client certificate a
   * guard with `mtls` reads by default. Typed loosely: a plain `net.Socket` and a `TLSSocket` both fit.
   */
  socket?: unknown;
}

/**
 * Where the token was found, or why the request is refused before any token work.
 *
 * @example
 * const found: TokenExtraction = extractBearerToken(request, { allowQueryToken: false, maxLength: 8192 });
 */
export type TokenExtraction =
  | { ok: true; token: string; scheme?: 'Bearer' | 'DPoP'; proof?: string }
  | { ok: false; code: GuardErrorCode; scheme?: 'Bearer' | 'DPoP' };

// RFC 6750 §2.1: credentials = "Bearer" 1*SP b64token; the scheme is case-insensitive (RFC 7235).
const bearerCredentials = /^bearer +([A-Za-z0-9\-._~+/]+=*)$/i;
const bearerPrefix = /^bearer(?:$|[^A-Za-z0-9!#$%&'*+.^_`|~-])/i;
const dpopCredentials = /^dpop +([A-Za-z0-9\-._~+/]+=*)$/i;
const dpopPrefix = /^dpop(?:$|[^A-Za-z0-9!#$%&'*+.^_`|~-])/i;

// Only strings count as header values. The types say so, but a JavaScript caller's header map may hold
// anything, and a number where a string was expected must not make the guard throw.
function values(value: string | string[] | undefined): string[] {
  if (typeof value === 'string') return [value];
  if (!Array.isArray(value)) return [];
  return value.every((item) => typeof item === 'string') ? value : value.filter((item) => typeof item === 'string');
}

/**
 * True when the request target `url` carries the RFC 6750 §2.3 `access_token` query parameter, with
 * or without a value, under any percent-encoding of its name (`access%5Ftoken` is the same parameter
 * once decoded, as the guard decodes it where it reads one). For a guard that tells a request with
 * a credential from an anonymous one, and for a gateway that must not forward a token in a URL.
 *
 * @example
 * hasQueryToken('/photos?access_token=eyJ...'); // true
 * hasQueryToken('/photos?token=x'); // false
 */
export function hasQueryToken(url: string | undefined): boolean {
  if (typeof url !== 'string') return false;
  const question = url.indexOf('?');
  return question !== -1 && new URLSearchParams(url.slice(question + 1)).has('access_token');
}

function queryTokens(url: string | undefined): string[] {
  if (typeof url !== 'string') return [];
  const question = url.indexOf('?');
  if (question === -1) return [];
  return new URLSearchParams(url.slice(question + 1)).getAll('access_token');
}

/**
 * Finds the bearer token of a request:
 * - no Authorization header, or another scheme (`Basic`, `Token`, `DPoP`): `token_missing`
 *   (401 without an `error` attribute: the request carried no bearer credentials at all);
 * - two Authorization headers: `multiple_tokens` (400);
 * - `Bearer` followed by nothing, a tab, or more than one token: `authorization_malformed` (400);
 * - a header longer than `maxLength` plus 7 (the `Bearer ` before the token): `token_too_large` (400),
 *   before any parsing.
 * The `access_token` query parameter is read only with `allowQueryToken` (RFC 6750 §2.3 discourages
 * it); then a header and a query token, or two query tokens, are `multiple_tokens` too. Without it the
 * query is not looked at: `?access_token=a&access_token=b` is just no credential (`token_missing`).
 * With DPoP enabled, `DPoP <token>` plus exactly one `DPoP` proof header is read too (RFC 9449);
 * with DPoP required, a Bearer credential counts as none.
 *
 * @example
 * extractBearerToken({ headers: { authorization: 'Bearer abc.def.ghi' } }, { allowQueryToken: false, maxLength: 8192 });
 * // { ok: true, token: 'abc.def.ghi' }
 */
export function extractBearerToken(
  request: GuardRequest,
  options: { allowQueryToken: boolean; maxLength: number; dpop?: 'off' | 'allowed' | 'required' | undefined },
): TokenExtraction {
  const dpop = options.dpop ?? 'off';
  const headers = values(request.headers.authorization);
  // A disabled query token is no token at all: it is neither read nor counted.
  const queries = options.allowQueryToken ? queryTokens(request.url) : [];
  if (headers.length > 1 || queries.length > 1 || (headers.length === 1 && queries.length === 1)) {
    return { ok: false, code: 'multiple_tokens' };
  }
  if (headers.length === 1) {
    const header = headers[0] as string;
    // The length check comes first: nothing below runs on an oversized value.
    if (header.length > options.maxLength + 7) return { ok: false, code: 'token_too_large' };
    if (dpop !== 'off' && dpopPrefix.test(header)) {
      const match = dpopCredentials.exec(header);
      if (match === null) return { ok: false, code: 'authorization_malformed', scheme: 'DPoP' };
      // RFC 9449 §4.1: exactly one DPoP header carrying the proof.
      const proofs = values(request.headers.dpop);
      if (proofs.length !== 1 || (proofs[0] as string).length > options.maxLength) {
        return { ok: false, code: 'dpop_proof_invalid', scheme: 'DPoP' };
      }
      return { ok: true, token: match[1] as string, scheme: 'DPoP', proof: proofs[0] as string };
    }
    if (!bearerPrefix.test(header)) return { ok: false, code: 'token_missing' };
    // With DPoP required a plain bearer token is no acceptable credential at all.
    if (dpop === 'required') return { ok: false, code: 'token_missing' };
    const match = bearerCredentials.exec(header);
    if (match === null) return { ok: false, code: 'authorization_malformed' };
    return { ok: true, token: match[1] as string, scheme: 'Bearer' };
  }
  if (queries.length === 1 && dpop !== 'required') {
    const token = queries[0] as string;
    if (token.length > options.maxLength) return { ok: false, code: 'token_too_large' };
    if (token.length === 0) return { ok: false, code: 'authorization_malformed' };
    return { ok: true, token };
  }
  return { ok: false, code: 'token_missing' };
}

/**
 * Reads a single-valued token header (the internal token behind the gateway). Two values are
 * `multiple_tokens`; none is `token_missing`.
 *
 * @example
 * extractHeaderToken({ headers: { 'idem-internal-token': 'a.b.c' } }, 'idem-internal-token', 8192);
 */
export function extractHeaderToken(request: GuardRequest, name: string, maxLength: number): TokenExtraction {
  const found = values(request.headers[name]);
  if (found.length === 0) return { ok: false, code: 'token_missing' };
  if (found.length > 1) return { ok: false, code: 'multiple_tokens' };
  const token = (found[0] as string).trim();
  if (token.length > maxLength) return { ok: false, code: 'token_too_large' };
  if (token.length === 0) return { ok: false, code: 'authorization_malformed' };
  return { ok: true, token };
}

/**
 * The parts of a Node `IncomingMessage` the guard reads.
 *
 * @example
 * const message: NodeRequestLike = req; // an http.IncomingMessage
 */
export interface NodeRequestLike {
  headers: Record<string, string | string[] | undefined>;
  headersDistinct?: Record<string, string[] | undefined>;
  /** The fields as sent, name and value in turn (read when `headersDistinct` is missing: HTTP/2). */
  rawHeaders?: readonly string[];
  // `| undefined` spelt out: Node's IncomingMessage declares them so, and under
  // exactOptionalPropertyTypes a request must be accepted as it is.
  url?: string | undefined;
  method?: string | undefined;
  /** The connection (a `TLSSocket` over HTTPS), passed on for `mtls`. */
  socket?: unknown;
}

// Every value of a field, from the name/value list Node keeps as sent. For an HTTP/2 request, which
// has no `headersDistinct` and keeps only the first `Authorization` in `headers`: the second one must
// be seen for the single-credential rule.
function rawValues(raw: readonly string[] | undefined, name: string): string[] | undefined {
  if (!Array.isArray(raw)) return undefined;
  const lower = name.toLowerCase();
  let values: string[] | undefined;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    if ((raw[i] as string).toLowerCase() !== lower) continue;
    if (values === undefined) values = [raw[i + 1] as string];
    else values.push(raw[i + 1] as string);
  }
  return values;
}

/**
 * Builds a {@link GuardRequest} from a Node request. Node keeps only the first of two `Authorization`
 * headers in `headers`; `headersDistinct` keeps both, so the single-credential rule (RFC 6750 §2)
 * sees them. Framework glue calls this and nothing else.
 *
 * @example
 * const result = await guard.authenticate(guardRequestFromNode(req, { url: req.originalUrl }));
 */
export function guardRequestFromNode(
  message: NodeRequestLike,
  options: { url?: string | undefined; tokenHeaders?: readonly string[] | undefined } = {},
): GuardRequest {
  const headers: Record<string, string | string[] | undefined> = { ...message.headers };
  for (const name of ['authorization', 'dpop', ...(options.tokenHeaders ?? [])]) {
    // `headersDistinct` where Node has it (HTTP/1.1); the raw list only where it has not (HTTP/2).
    const distinct =
      message.headersDistinct !== undefined ? message.headersDistinct[name] : rawValues(message.rawHeaders, name);
    if (distinct !== undefined) headers[name] = distinct.length === 1 ? distinct[0] : distinct;
  }
  const url = options.url ?? message.url;
  return {
    headers,
    ...(url === undefined ? {} : { url }),
    ...(message.method === undefined ? {} : { method: message.method }),
    // For `mtls`: the TLS peer certificate is read from it, and only for a certificate-bound token.
    ...(message.socket === undefined || message.socket === null ? {} : { socket: message.socket }),
  };
}
