import { problemType } from '@idem/core';
import type { Response } from 'express';

/**
 * Every problem the API answers with besides the guard's (401/403) and the idempotency layer's
 * (400/409/422/503 on keys): one row per stable code, its status, its fixed title, and whether the
 * same request sent again can succeed (`retryable`, which clients such as `@idem/client` honour).
 * Titles and details never echo tokens, keys or bodies.
 */
export const apiProblemTable = {
  body_malformed: { status: 400, title: 'The body could not be read', retryable: false },
  path_malformed: { status: 400, title: 'The request path is not valid', retryable: false },
  body_too_large: { status: 413, title: 'The body is too large', retryable: false },
  unsupported_media_type: { status: 415, title: 'The body is not in a supported format', retryable: false },
  validation_failed: { status: 422, title: 'The request is not valid', retryable: false },
  too_many_items: { status: 422, title: 'Too many items in one batch', retryable: false },
  unknown_item: { status: 404, title: 'Unknown stock item', retryable: false },
  photo_not_found: { status: 404, title: 'No such photo', retryable: false },
  route_not_found: { status: 404, title: 'No such resource', retryable: false },
  method_not_allowed: { status: 405, title: 'Method not allowed', retryable: false },
  // The API's database could not answer (a connection refused or ended, a pool that timed out): the
  // same request, sent again after Retry-After, may succeed. The idempotency layer's own store
  // failing is the core's 503 `store_unavailable`.
  database_unavailable: { status: 503, title: 'The database is unavailable', retryable: true },
  // The creates release a 5xx (outcome.ts): nothing happened, and the same request may succeed.
  internal_error: { status: 500, title: 'Internal error', retryable: true },
} as const;

/** A stable API problem code; clients match on it, never on the title. */
export type ApiProblemCode = keyof typeof apiProblemTable;

// The RFC 9457 `type` of a code is the library's: one stable URI per error, documented in the
// reference app's README.
export { problemType };

/**
 * Answers with an `application/problem+json` body (RFC 9457) for `code`. `extensions` adds members
 * such as the names of invalid fields; they are written by the API, never copied from the request.
 *
 * @example
 * ```ts
 * sendProblem(res, 'validation_failed', 'amount must be a positive integer', { invalid: ['amount'] });
 * ```
 */
export function sendProblem(
  res: Response,
  code: ApiProblemCode,
  detail: string,
  extensions: Record<string, unknown> = {},
): void {
  const { status, title, retryable } = apiProblemTable[code];
  res
    .status(status)
    .type('application/problem+json')
    .set('Cache-Control', 'no-store')
    .send(JSON.stringify({ type: problemType(code), title, status, detail, code, retryable, ...extensions }));
}
