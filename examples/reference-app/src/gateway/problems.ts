import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { type ProblemDetails, problemType } from '@idem/core';
import type { FastifyReply } from 'fastify';
import { apiProblemTable } from '../api/problem.js';
import { startingUpProblem, startingUpRetryAfterSeconds } from '../starting-up.js';

/** Answers with an `application/problem+json` body (RFC 9457), never cached; `challenge` is a `WWW-Authenticate`. */
export function sendProblem(reply: FastifyReply, status: number, problem: object, challenge?: string): FastifyReply {
  if (challenge !== undefined) reply.header('www-authenticate', challenge);
  return reply
    .code(status)
    .header('cache-control', 'no-store')
    .type('application/problem+json')
    .send(JSON.stringify(problem));
}

/**
 * Answers the 503 `starting_up` problem with `Retry-After`: the gateway is not ready yet.
 *
 * @example
 * ```ts
 * if (!ready) return sendStartingUp(reply);
 * ```
 */
export function sendStartingUp(reply: FastifyReply): FastifyReply {
  reply.header('retry-after', String(startingUpRetryAfterSeconds));
  return sendProblem(reply, 503, startingUpProblem);
}

/** The problem of an upstream that could not be reached (502) or did not answer in time (504). */
export const upstreamProblem = (status: 502 | 504): ProblemDetails => ({
  type: problemType(status === 504 ? 'upstream_timeout' : 'upstream_unavailable'),
  title: status === 504 ? 'The API did not answer in time' : 'The API is unavailable',
  status,
  detail: 'The request could not be forwarded; retry later with the same Idempotency-Key.',
  code: status === 504 ? 'upstream_timeout' : 'upstream_unavailable',
  retryable: true,
});

/**
 * The problem of a request path the gateway will not forward: one that does not decode, climbs out of
 * its service with `..`, or holds a backslash (which URL parsing reads as a slash, up to another host).
 */
export const pathMalformedProblem: ProblemDetails = {
  type: problemType('path_malformed'),
  title: 'The request path is not valid',
  status: 400,
  detail: 'The path does not decode as UTF-8, holds a backslash, or climbs out of its service with "..".',
  code: 'path_malformed',
  retryable: false,
};

/** The problem of a method the gateway forwards to no service (its `Allow` header lists those it does). */
export const methodNotAllowedProblem: ProblemDetails = {
  type: problemType('method_not_allowed'),
  title: apiProblemTable.method_not_allowed.title,
  status: 405,
  detail: 'The gateway forwards no request of this method.',
  code: 'method_not_allowed',
  retryable: false,
};

/**
 * The problem for an error Fastify or `@fastify/reply-from` raised before the request reached a
 * service: a path that does not decode (`%E0%A4%A`, Fastify's FST_ERR_BAD_URL), one that climbs out
 * with `..` (reply-from), 413 and 415 with the API's codes (`body_too_large`,
 * `unsupported_media_type`), any other 4xx with its status (`request_refused`), 502 to 504 as the
 * upstream problems (retryable), and anything else as a 500.
 * Their own answer would be `application/json` with their message; every error of the gateway is a
 * problem, and none echoes the request.
 *
 * @example
 * ```ts
 * app.setErrorHandler((error, _request, reply) => {
 *   const problem = frameworkProblem(error);
 *   sendProblem(reply, problem.status, problem);
 * });
 * ```
 */
export function frameworkProblem(error: unknown): ProblemDetails {
  const given = (error as { statusCode?: unknown } | null)?.statusCode;
  const code = (error as { code?: unknown } | null)?.code;
  // The link to the API failed after reply-from had handed its answer on (the head came, the body
  // did not start), so reply-from's onError no longer sees it: undici's socket and timeout errors,
  // or a reset, with no status. Still the API's failure, and still retryable, not the gateway's own.
  if (typeof given !== 'number' && isUpstreamFailure(code)) return upstreamFailureProblem(error);
  const status = typeof given === 'number' && given >= 400 && given < 600 ? given : 500;
  // The statuses the API answers too carry the API's codes: a caller matches on `code`, whichever
  // part of the stack refused the request.
  if (status === 413 || status === 415) {
    const apiCode = status === 413 ? 'body_too_large' : 'unsupported_media_type';
    return {
      type: problemType(apiCode),
      title: apiProblemTable[apiCode].title,
      status,
      detail:
        status === 413
          ? 'The body is larger than the gateway accepts.'
          : 'Send the body as JSON in UTF-8 (application/json; charset=utf-8).',
      code: apiCode,
      retryable: false,
    };
  }
  if (status === 400 && (code === 'FST_ERR_BAD_URL' || isPathRefusal(error))) return { ...pathMalformedProblem };
  // A timeout or an overload (502, 503, 504) may pass: the same problems as an upstream that could not
  // be reached, retryable. Anything else is the gateway's own fault.
  if (status === 502 || status === 504) return { ...upstreamProblem(status) };
  if (status === 503) return { ...upstreamProblem(502), status };
  if (status >= 500) {
    return {
      type: problemType('internal_error'),
      title: 'Internal error',
      status: 500,
      detail: 'The gateway could not handle this request.',
      code: 'internal_error',
      // A fault of its own may pass, and the same request may then succeed: a keyed write is safe
      // to send again (the API deduplicates it), and a client like @idem/client honours `false`.
      retryable: true,
    };
  }
  return {
    type: problemType('request_refused'),
    title: STATUS_CODES[status] ?? 'Request refused',
    status,
    detail: 'The gateway refused this request before forwarding it.',
    code: 'request_refused',
    retryable: false,
  };
}

const upstreamCodes = new Set(['ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT', 'ERR_STREAM_PREMATURE_CLOSE']);
const isUpstreamFailure = (code: unknown): code is string =>
  typeof code === 'string' && (code.startsWith('UND_ERR_') || upstreamCodes.has(code));

/**
 * The problem of a link to the API that failed, from its error: 504 when it timed out (undici's
 * `UND_ERR_HEADERS_TIMEOUT`, `ETIMEDOUT`, a `TimeoutError`), else 502.
 */
export function upstreamFailureProblem(error: unknown): ProblemDetails {
  const failure = error as { code?: unknown; name?: unknown } | null;
  const timedOut = /timeout/i.test(String(failure?.code ?? failure?.name ?? ''));
  return { ...upstreamProblem(timedOut ? 504 : 502) };
}

/**
 * Answers a request Node's HTTP parser refused before Fastify saw it (a malformed head, headers over
 * the size limit, a head or body that took too long): 400, 431 or 408 as a problem, where Fastify's own
 * handler sends `application/json` of its own shape. Then closes the connection, whose framing can no
 * longer be trusted.
 *
 * @example
 * Fastify({ clientErrorHandler: clientErrorProblem });
 */
export function clientErrorProblem(error: Error & { code?: string }, socket: Duplex): void {
  // A reset connection has no one to answer.
  if (error.code === 'ECONNRESET' || socket.destroyed) return;
  const status = error.code === 'HPE_HEADER_OVERFLOW' ? 431 : error.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? 408 : 400;
  if (socket.writable) {
    const body = JSON.stringify(frameworkProblem({ statusCode: status }));
    socket.write(
      `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/problem+json\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy(error);
}

// @fastify/reply-from refuses a path holding ".." (or other characters it will not forward) with a
// plain 400 Error of its own.
function isPathRefusal(error: unknown): boolean {
  return error instanceof Error && /invalid characters/i.test(error.message);
}
