import { problemType } from '@idem/core';
import type { Response } from 'express';

/**
 * Every problem the API answers with besides the guard's (401/403) and the idempotency layer's
 * (400/409/422/503 on keys): one row per stable code, its status and its fixed title. Titles and
 * details never echo tokens, keys or bodies.
 */
export const apiProblemTable = {
  body_malformed: { status: 400, title: 'The body could not be read' },
  body_too_large: { status: 413, title: 'The body is too large' },
  unsupported_media_type: { status: 415, title: 'The body is not in a supported format' },
  validation_failed: { status: 422, title: 'The request is not valid' },
  too_many_items: { status: 422, title: 'Too many items in one batch' },
  unknown_item: { status: 404, title: 'Unknown stock item' },
  photo_not_found: { status: 404, title: 'No such photo' },
  route_not_found: { status: 404, title: 'No such resource' },
  internal_error: { status: 500, title: 'Internal error' },
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
  const { status, title } = apiProblemTable[code];
  res
    .status(status)
    .type('application/problem+json')
    .set('Cache-Control', 'no-store')
    .send(JSON.stringify({ type: problemType(code), title, status, detail, code, retryable: false, ...extensions }));
}
