import type { Attempt } from './attempt.js';

/**
 * Every way a request made through the client can fail, with what it means. Callers match on `code`.
 * `retried` says whether the client retried before giving up.
 *
 * @example
 * requestFailedCodes.deadline_exceeded; // 'The total deadline ran out before the request succeeded.'
 */
export const requestFailedCodes = {
  http_error: 'The server answered with a status that retrying cannot fix (for example 400, 404, 422).',
  network_error: 'The connection failed and the request could not be repeated safely (no key, not idempotent).',
  tls_failed:
    "The TLS handshake failed on the client's side: the server's certificate was refused (expired, self-signed, another host's), or the two ends share no TLS version; the attempt was not sent.",
  tls_refused:
    "The server refused the TLS handshake over the client's certificate (none presented, or one it does not trust); the request was not processed.",
  timeout:
    'The attempt timed out (its own timeout, or the deadline cutting it short) and the request could not be repeated safely (no key, not idempotent).',
  attempts_exhausted: 'Every allowed attempt failed with a retryable outcome.',
  deadline_exceeded: 'The total deadline ran out before the request succeeded.',
  retry_after_too_long: 'The server asked to wait (Retry-After) longer than maxRetryAfter allows.',
  aborted: "The caller's AbortSignal fired.",
  invalid_response_body: 'A successful response declared JSON but its body is not JSON.',
  response_too_large: 'The response body is longer than maxResponseBytes; it was not read to the end.',
  token_failed:
    'getToken threw, rejected or gave a token the Authorization header cannot carry; this attempt was not sent.',
  redirect_unreadable:
    'The server answered a write with a redirect the browser does not let scripts read; the write may have run.',
} as const;

/**
 * A stable code of {@link RequestFailedError}.
 *
 * @example
 * const retryLater: RequestFailedCode[] = ['deadline_exceeded', 'attempts_exhausted'];
 */
export type RequestFailedCode = keyof typeof requestFailedCodes;

/**
 * What a {@link RequestFailedError} carries besides its code.
 *
 * @example
 * new RequestFailedError('http_error', { response, body, key, attempts });
 */
export interface RequestFailedDetails {
  /**
   * The last response, if any attempt got one. Its body has been read (use `body`), unless
   * `parse: 'none'`: then it is left unread, yours to read or cancel.
   */
  response?: Response | undefined;
  /**
   * The last response's body, parsed like a successful one (a problem+json object, text, or bytes);
   * `undefined` with `parse: 'none'`.
   */
  body?: unknown;
  /** The key the operation used (decoded); reuse it to retry the same logical operation later. */
  key?: string | undefined;
  attempts?: readonly Attempt[];
  cause?: unknown;
}

/**
 * The one error the client rejects with for a request that did not succeed. Misuse (bad options, a
 * stream body) throws a `TypeError` instead; an error thrown by your own `getToken` is the `cause` of
 * a `token_failed` one, which carries the key (an earlier attempt may have run).
 *
 * Messages never contain keys, tokens or bodies.
 *
 * @example
 * try {
 *   await client.post('/charges', { amount: 500 });
 * } catch (error) {
 *   if (isRequestFailedError(error) && error.code === 'http_error' && error.status === 422) {
 *     // the key was used with another request: a bug in the caller, never retried
 *   }
 * }
 */
export class RequestFailedError extends Error {
  override readonly name = 'RequestFailedError' as const;
  readonly code: RequestFailedCode;
  /** The status of the last response, or `undefined` when no attempt got a response. */
  readonly status: number | undefined;
  readonly response: Response | undefined;
  readonly body: unknown;
  readonly key: string | undefined;
  /** True when the last response was a replay of a stored outcome. */
  readonly replayed: boolean;
  readonly attempts: readonly Attempt[];

  constructor(code: RequestFailedCode, details: RequestFailedDetails = {}) {
    const status = details.response?.status;
    super(
      status === undefined ? requestFailedCodes[code] : `${requestFailedCodes[code]} Last status: ${status}.`,
      details.cause === undefined ? undefined : { cause: details.cause },
    );
    this.code = code;
    this.status = status;
    this.response = details.response;
    this.body = details.body;
    this.key = details.key;
    this.replayed = details.response?.headers.get('idempotent-replayed')?.trim().toLowerCase() === 'true';
    this.attempts = details.attempts ?? [];
  }

  /** True when the client retried at least once before giving up. */
  get retried(): boolean {
    return this.attempts.length > 1;
  }
}

/**
 * True when `value` is a {@link RequestFailedError}, also across copies of the package (bundlers
 * sometimes include two).
 *
 * @example
 * if (isRequestFailedError(error) && error.code === 'deadline_exceeded') showOfflineBanner();
 */
export function isRequestFailedError(value: unknown): value is RequestFailedError {
  return (
    value instanceof Error &&
    value.name === 'RequestFailedError' &&
    typeof (value as RequestFailedError).code === 'string' &&
    Object.hasOwn(requestFailedCodes, (value as RequestFailedError).code)
  );
}
