// Methods whose repeat leaves the same result (RFC 9110 9.2.2; spec part 1: PUT and DELETE), and
// QUERY, a GET with a body that the IETF draft (httpbis-safe-method-w-body) defines safe and
// idempotent: a search sent twice searches twice and changes nothing.
const idempotentMethods: ReadonlySet<string> = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE', 'PUT', 'DELETE', 'QUERY']);

// The names fetch upper-cases (Fetch standard, "normalize a method"), PATCH and QUERY:
// `request('patch')` is what a caller means, and a lower-case patch reaches no server's PATCH route
// (Node's parser does not even accept a lower-case `query`).
const normalizedMethods: ReadonlySet<string> = new Set([
  'DELETE',
  'GET',
  'HEAD',
  'OPTIONS',
  'POST',
  'PUT',
  'PATCH',
  'QUERY',
]);

/**
 * A method as it goes on the wire: the standard names upper-cased, any other as written (methods
 * are case-sensitive, RFC 9110 9.1: a server may route `purge` and `PURGE` apart).
 *
 * @example
 * normalizeMethod('patch'); // 'PATCH'
 * normalizeMethod('purge'); // 'purge'
 */
export function normalizeMethod(method: string): string {
  const upper = method.toUpperCase();
  return normalizedMethods.has(upper) ? upper : method;
}

/**
 * True for methods that are safe to repeat without a key: GET, HEAD, OPTIONS, TRACE, PUT, DELETE,
 * and QUERY. POST and PATCH are not, and get an `Idempotency-Key`.
 *
 * @example
 * isIdempotentMethod('PUT');  // true
 * isIdempotentMethod('POST'); // false
 */
export function isIdempotentMethod(method: string): boolean {
  return idempotentMethods.has(method.toUpperCase());
}

/**
 * What a retry decision depends on besides the outcome itself.
 *
 * @example
 * isSafeToRepeat({ method: 'POST', keyed: true }); // true
 */
export interface RetryContext {
  method: string;
  /** Whether the attempt carried an `Idempotency-Key`. */
  keyed: boolean;
}

/**
 * Whether a response status is worth retrying:
 * - 429: always; the server refused the request before doing anything.
 * - 409: only with a key. With a key it means "the first request with this key is still running"
 *   (spec part 7), which a later retry resolves; without one it is a real state conflict.
 * - 500, 502, 503, 504: only when a repeat is safe (an idempotent method, or a key). Without a key
 *   a POST may have run before the error, and a repeat could run it twice.
 * - 520 to 524, a CDN's names for the same failures (Cloudflare: the origin answered something
 *   unexpected, is down, timed out on connect, is unreachable, timed out on the answer): as 502-504.
 *   Other 5xx (501, 505, 507, 511, ...) say the request or the server must change first.
 * - 408 Request Timeout and 425 Too Early: also only when a repeat is safe. RFC 9110 15.5.9 lets a
 *   client repeat a 408 (the server gave up before the whole request arrived) and RFC 8470 5.2 a 425
 *   (the server would not risk running it from early data), so a repeat fixes both. They are not
 *   trusted to mean "it never ran" for an unkeyed POST: some servers and proxies answer 408 for a
 *   handler of their own that timed out, after it started.
 * - Anything else, including every other 4xx: never. The request itself must change first.
 *
 * @example
 * isRetryableStatus(409, { method: 'POST', keyed: true }); // true
 * isRetryableStatus(408, { method: 'POST', keyed: true }); // true
 * isRetryableStatus(422, { method: 'POST', keyed: true }); // false
 */
export function isRetryableStatus(status: number, context: RetryContext): boolean {
  if (status === 429) return true;
  if (status === 409) return context.keyed;
  if (status === 500 || status === 502 || status === 503 || status === 504) return isSafeToRepeat(context);
  if (status >= 520 && status <= 524) return isSafeToRepeat(context);
  if (status === 408 || status === 425) return isSafeToRepeat(context);
  return false;
}

// The codes Node (OpenSSL, and its own host check) gives a TLS certificate it refuses. The handshake
// fails before a byte of the request is sent, and the next attempt meets the same certificate.
const certificateErrorCodes: ReadonlySet<string> = new Set([
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_REVOKED',
  'CERT_REJECTED',
  'CERT_UNTRUSTED',
  'CERT_SIGNATURE_FAILURE',
  'CERT_CHAIN_TOO_LONG',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_DECRYPT_CERT_SIGNATURE',
  'UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY',
  'ERROR_IN_CERT_NOT_BEFORE_FIELD',
  'ERROR_IN_CERT_NOT_AFTER_FIELD',
  'INVALID_CA',
  'INVALID_PURPOSE',
  'PATH_LENGTH_EXCEEDED',
  'HOSTNAME_MISMATCH',
  'ERR_TLS_CERT_ALTNAME_INVALID',
]);

// Deno's fetch (rustls) gives a refused certificate no `code`: only its message says so, in the
// words rustls uses for every such refusal ("invalid peer certificate: UnknownIssuer", "...: Expired",
// "...: NotValidForName", "...: Other(OtherError(CaUsedAsEndEntity))" for a self-signed one).
const rustlsCertificateRefusal = /\binvalid peer certificate\b/;

/**
 * True when `test` holds for `error` or an error in its `cause` chain (undici wraps the socket's error
 * in `TypeError: fetch failed`), read as `{ code, message }`. A few levels at most: a cause chain is
 * short, and a cyclic one must not loop.
 */
function inCauseChain(error: unknown, test: (code: unknown, message: unknown) => boolean): boolean {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && typeof current === 'object' && current !== null; depth++) {
    const { code, message } = current as { code?: unknown; message?: unknown };
    if (test(code, message)) return true;
    current = (current as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * True when a failed fetch was a TLS certificate the runtime refused (expired, self-signed, another
 * host's), read from the `code` of the error or of a `cause` under it (undici wraps it in
 * `TypeError: fetch failed`; Bun's error carries the same codes), or, on Deno, which sets no code,
 * from rustls' "invalid peer certificate" in the message. Such an attempt never reached the server,
 * and a retry meets the same certificate: it is a configuration error, not a "try later". Browsers
 * hide the cause, so there it stays a network error.
 *
 * @example
 * isCertificateError(new TypeError('fetch failed', { cause: Object.assign(new Error(), { code: 'CERT_HAS_EXPIRED' }) })); // true
 */
export function isCertificateError(error: unknown): boolean {
  return inCauseChain(
    error,
    (code, message) =>
      (typeof code === 'string' && certificateErrorCodes.has(code)) ||
      (typeof message === 'string' && rustlsCertificateRefusal.test(message)),
  );
}

// The codes of a handshake that failed over the protocol itself: the two ends share no TLS version
// (the server's `protocol_version` alert, or one the client will not speak). They come only from the
// handshake: nothing was sent, and every attempt meets the same server, a configuration error as a
// refused certificate. Not "wrong version number" (`https:` to a port that answers plain HTTP):
// OpenSSL says the same of a record that is not TLS on a connection whose handshake is done, a
// middlebox's plain-text answer after the request went out, and a fetch over node:https keeps that
// code: the request may have run, an unknown outcome like any connection lost.
const protocolMismatchCodes: ReadonlySet<string> = new Set([
  'ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION',
  'ERR_SSL_UNSUPPORTED_PROTOCOL',
  'ERR_SSL_NO_PROTOCOLS_AVAILABLE',
]);

/**
 * True when a failed fetch was a TLS handshake that failed over the protocol: a server and client
 * with no TLS version in common. Read from the `code` of the error or of a `cause` under it. The
 * request never left the client. (`https:` to a port that answers plain HTTP is not one: its "wrong
 * version number" may also come after the request went out; see the codes above.)
 *
 * @example
 * isProtocolMismatch(new TypeError('fetch failed', { cause: Object.assign(new Error(), { code: 'ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION' }) })); // true
 */
export function isProtocolMismatch(error: unknown): boolean {
  return inCauseChain(error, (code) => typeof code === 'string' && protocolMismatchCodes.has(code));
}

// The alerts a server sends when it refuses the TLS handshake over the client's certificate: none
// was presented (TLS 1.3 `certificate_required`; over TLS 1.2 OpenSSL says `handshake_failure`,
// which also covers no shared cipher or version, as final), or one it does not trust or accept.
// Node names them from OpenSSL's reason strings: "ssl/tls alert ..." since OpenSSL 3, "sslv3 alert
// ..." before. The next attempt presents the same certificate and meets the same refusal.
const handshakeRefusalCodes: ReadonlySet<string> = new Set([
  'ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE',
  'ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE',
  'ERR_SSL_SSL/TLS_ALERT_BAD_CERTIFICATE',
  'ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE',
  'ERR_SSL_SSL/TLS_ALERT_UNSUPPORTED_CERTIFICATE',
  'ERR_SSL_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE',
  'ERR_SSL_SSL/TLS_ALERT_CERTIFICATE_REVOKED',
  'ERR_SSL_SSLV3_ALERT_CERTIFICATE_REVOKED',
  'ERR_SSL_SSL/TLS_ALERT_CERTIFICATE_EXPIRED',
  'ERR_SSL_SSLV3_ALERT_CERTIFICATE_EXPIRED',
  'ERR_SSL_SSL/TLS_ALERT_CERTIFICATE_UNKNOWN',
  'ERR_SSL_SSLV3_ALERT_CERTIFICATE_UNKNOWN',
  'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA',
  'ERR_SSL_TLSV1_ALERT_ACCESS_DENIED',
  'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED',
]);

/**
 * True when a failed fetch was the server refusing the TLS handshake with an alert about the
 * client's certificate (none presented, one its CA did not sign, an expired or revoked one), read
 * from the `code` of the error or of a `cause` under it, as undici wraps it in `TypeError: fetch
 * failed`. The server processed nothing, and a retry presents the same certificate: a configuration
 * error, not a "try later". Only when the alert reaches the error: over TLS 1.3 it arrives after the
 * client sent the request, and undici reports the socket closing instead (`UND_ERR_SOCKET`), which
 * cannot be told from a connection dropped after the request went out. Browsers hide the cause.
 *
 * @example
 * isHandshakeRefused(new TypeError('fetch failed', { cause: Object.assign(new Error(), { code: 'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA' }) })); // true
 */
export function isHandshakeRefused(error: unknown): boolean {
  return inCauseChain(error, (code) => typeof code === 'string' && handshakeRefusalCodes.has(code));
}

// The codes Node (and undici) give a connection that was never made: refused, no route, a name that
// did not resolve, a connect that timed out. No byte of the request left the client.
const notConnectedCodes: ReadonlySet<string> = new Set([
  'ECONNREFUSED',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EADDRNOTAVAIL',
  'ENOTFOUND',
  'EAI_AGAIN',
  'UND_ERR_CONNECT_TIMEOUT',
]);

// Node's message for a connection closed during the TLS handshake (lib/_tls_wrap.js, code
// ECONNRESET): the client writes no request before its handshake is done, so nothing was sent. A
// Node server gives this to a client certificate its CA did not sign (it drops the connection
// without an alert), as does a network that cuts the handshake.
const beforeTlsEstablished = /\bbefore secure TLS connection was established\b/;

/**
 * True when a failed fetch never connected (refused, unreachable, a name that did not resolve, a
 * connect timeout, a TLS handshake cut off before it was done), read from the `code` (and, for the
 * handshake, Node's message) of the error or of a `cause` under it, as undici wraps it in
 * `TypeError: fetch failed`. Nothing was sent, so a repeat is harmless whatever the method, which a
 * connection that broke after the request went out (a reset, a hang-up) does not say. Browsers hide
 * the cause, so there every network error stays an unknown outcome.
 *
 * @example
 * isNotConnected(new TypeError('fetch failed', { cause: Object.assign(new Error(), { code: 'ECONNREFUSED' }) })); // true
 */
export function isNotConnected(error: unknown): boolean {
  return inCauseChain(
    error,
    (code, message) =>
      (typeof code === 'string' && notConnectedCodes.has(code)) ||
      (code === 'ECONNRESET' && typeof message === 'string' && beforeTlsEstablished.test(message)),
  );
}

/**
 * Whether a request whose outcome is unknown (connection lost, timed out) may be sent again: only
 * when the method is idempotent or a key makes the server run it at most once.
 *
 * @example
 * isSafeToRepeat({ method: 'POST', keyed: false }); // false
 */
export function isSafeToRepeat(context: RetryContext): boolean {
  return context.keyed || isIdempotentMethod(context.method);
}

/**
 * The members of an RFC 9457 problem (`application/problem+json`) body, read from its raw bytes, so
 * the caller's `parse` mode (`text`, `bytes`, ...) does not change a decision made from them. A body
 * of another type, one that does not parse, or one that is not an object gives `undefined`.
 *
 * @example
 * problemOf('application/problem+json', new TextEncoder().encode('{"code":"body_incomplete"}')); // { code: 'body_incomplete' }
 */
export function problemOf(
  contentType: string | null,
  bytes: Uint8Array | undefined,
): Record<string, unknown> | undefined {
  if (bytes === undefined || contentType === null) return undefined;
  if (!/^\s*application\/problem\+json\s*(?:;|$)/i.test(contentType)) return undefined;
  let problem: unknown;
  try {
    problem = JSON.parse(new TextDecoder().decode(bytes));
  } catch {
    return undefined;
  }
  return typeof problem === 'object' && problem !== null ? (problem as Record<string, unknown>) : undefined;
}

/**
 * True when a problem says `"retryable": false`: the server's own word that asking again changes
 * nothing (idem's problems, and any service that follows them, carry that member). It turns the
 * status rule down: a handler's business 409 on a keyed POST ("the seat is taken") is final on the
 * first answer instead of after one wasted retry that comes back replayed.
 *
 * @example
 * saysNotRetryable({ retryable: false }); // true
 */
export function saysNotRetryable(problem: Record<string, unknown> | undefined): boolean {
  return problem?.retryable === false;
}

/**
 * True for a 401 whose problem says `"retryable": true`: @idem/guard's fail-closed refusals
 * (`keys_unavailable`: the issuer's keys could not be fetched; `dpop_replay_full`,
 * `dpop_replay_share_full`, `dpop_replay_unavailable`: the DPoP replay memory is full or down). The
 * fault is the server's dependency, not the token, and the same token may pass later. Only a 401
 * (the request was not let in), and a repeat is only made where one is harmless: a `retryable` on a
 * 4xx is not trusted to mean that nothing ran.
 *
 * @example
 * saysRefusedForNow(401, { code: 'keys_unavailable', retryable: true }); // true
 * saysRefusedForNow(403, { retryable: true }); // false
 */
export function saysRefusedForNow(status: number, problem: Record<string, unknown> | undefined): boolean {
  return status === 401 && problem?.retryable === true;
}

/**
 * True for idem's 400 `body_incomplete`: the body reached the server cut short (a proxy or the
 * network dropped the end of the upload), and the server claimed and ran nothing. Sending the same
 * request again is what fixes it. Only this code turns the status rule up: a generic
 * `"retryable": true` on a 4xx is not trusted to mean that nothing ran.
 *
 * @example
 * saysBodyIncomplete({ code: 'body_incomplete', retryable: true }); // true
 */
export function saysBodyIncomplete(problem: Record<string, unknown> | undefined): boolean {
  return problem?.code === 'body_incomplete' && problem.retryable !== false;
}

/**
 * True for @idem/guard's `certificate_missing`: a token bound to a client certificate (RFC 8705) came
 * on a request without one. Its challenge says `invalid_token` (RFC 8705 §3), but a token asked for
 * afresh does not give the request the certificate it lacks, so it is no reason to refresh. Its twin
 * `certificate_mismatch` is not caught here: after a certificate rotation, the cached token is bound
 * to the old certificate and a fresh one, issued over the new, passes. Exported for callers with a
 * retry or refresh loop of their own, to read a 401's problem (`error.body`) as the client does.
 *
 * @example
 * saysCertificateMissing({ code: 'certificate_missing', retryable: false }); // true
 * saysCertificateMissing({ code: 'certificate_mismatch' }); // false
 */
export function saysCertificateMissing(problem: Record<string, unknown> | undefined): boolean {
  return problem?.code === 'certificate_missing';
}

/**
 * True when a `WWW-Authenticate` field holds a Bearer challenge with `error="invalid_token"` (RFC
 * 6750 3.1: the token expired, was revoked or is malformed; "the client MAY request a new access
 * token and retry"). A challenge without an error (no token was sent) or with another one
 * (`insufficient_scope`: a new token of the same grant changes nothing) gives false.
 *
 * @example
 * saysTokenInvalid('Bearer realm="api", error="invalid_token"'); // true
 * saysTokenInvalid('Bearer realm="api"'); // false
 */
export function saysTokenInvalid(wwwAuthenticate: string | null): boolean {
  if (wwwAuthenticate === null) return false;
  const bearer = /(?:^|,)\s*Bearer(?:\s|,|$)/i.exec(wwwAuthenticate);
  if (bearer === null) return false;
  // The parameters after the Bearer scheme, up to the next challenge's scheme (a token followed by
  // a space, then a token68 or a parameter). Quoted values are blanked to the same length for that
  // search, so a comma or a word inside an error_description cannot be mistaken for one.
  const rest = wwwAuthenticate.slice(bearer.index + bearer[0].length);
  const blanked = rest.replace(/"(?:[^"\\]|\\.)*"/g, (quoted) => `"${'_'.repeat(quoted.length - 2)}"`);
  const next = /,\s*[!#$%&'*+.^`|~\w-]+\s+[!#$%&'*+.^`|~\w-]+\s*(?:=|,|$)/.exec(blanked);
  const params = next === null ? rest : rest.slice(0, next.index);
  return /(?:^|[\s,])error\s*=\s*(?:"invalid_token"|invalid_token)(?:\s*(?:,|$))/i.test(params);
}
