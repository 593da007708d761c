import express, { type NextFunction, type Request, type RequestHandler, type Response } from 'express';
import { charsetOf, isUtf8Charset } from '../charset.js';
import { sendProblem } from './problem.js';

/** The result of checking a body: the typed value, or the names of the invalid fields. */
export type Checked<T> = { ok: true; value: T } | { ok: false; detail: string; invalid: string[] };

/**
 * Parses an `application/json` body of at most `limit` and requires it to be an object. Other
 * media types, and a charset other than UTF-8, get 415, bad JSON 400, a larger body 413, all as
 * problem+json (the API's error handler maps the parser's errors). Well-formed JSON that is not an
 * object (an array, `null`, a string, a number, a boolean) is 422 `validation_failed`: the body was
 * read, its shape is wrong.
 *
 * @example
 * ```ts
 * app.put('/settings', jsonObjectBody('4kb'), handler);
 * ```
 */
export function jsonObjectBody(limit: string): RequestHandler[] {
  // Not strict: the strict parser throws on a top-level value other than an object or an array, and
  // that error is the 400 `body_malformed` of JSON that does not parse. Every shape that parses
  // reaches `requireObject` below instead, and gets the same 422.
  const parse = express.json({ limit, strict: false, type: () => true });
  const requireJson = (req: Request, res: Response, next: NextFunction) => {
    if (!req.is('application/json')) {
      sendProblem(res, 'unsupported_media_type', 'Send the body as application/json.');
      return;
    }
    // Before the parser, which decodes any `utf-` charset (UTF-16 and UTF-32 too).
    const contentType = req.get('content-type');
    if (!isUtf8Charset(contentType)) {
      sendProblem(res, 'unsupported_media_type', 'Send the body as JSON in UTF-8 (application/json; charset=utf-8).');
      return;
    }
    // `utf8` is UTF-8, but the parser takes `utf-` charsets only: it is told so in its own spelling.
    // (The idempotency middleware after it on these routes, whose fingerprint reads both as UTF-8 too,
    // sees one spelling for both.)
    if (charsetOf(contentType) === 'utf8') req.headers['content-type'] = 'application/json; charset=utf-8';
    next();
  };
  const requireObject = (req: Request, res: Response, next: NextFunction) => {
    const body: unknown = req.body;
    if (body === null || typeof body !== 'object' || Array.isArray(body)) {
      sendProblem(res, 'validation_failed', 'The body must be a JSON object.', { invalid: [] });
      return;
    }
    next();
  };
  return [requireJson, parse, requireObject];
}

/**
 * The names in `body` that are not in `allowed`: full-content bodies (PUT) and charges refuse unknown
 * members instead of silently dropping them.
 *
 * @example
 * ```ts
 * unknownFields({ theme: 'dark', colour: 'red' }, ['theme']); // ['colour']
 * ```
 */
export function unknownFields(body: Record<string, unknown>, allowed: readonly string[]): string[] {
  return Object.keys(body).filter((name) => !allowed.includes(name));
}

/**
 * True for a safe integer in `[min, max]`. A JSON number like `10.0` parses to an integer and passes;
 * strings never do.
 *
 * @example
 * ```ts
 * isIntegerIn(1000, 1, 100_000_000); // true
 * ```
 */
export function isIntegerIn(value: unknown, min: number, max: number): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= min && value <= max;
}

/** Stock item ids and photo ids: short, URL-safe, no spaces. */
export const resourceId = /^[A-Za-z0-9_-]{1,64}$/;

/**
 * Sends the 422 of a failed {@link Checked} and returns true, or returns false when it passed.
 *
 * @example
 * ```ts
 * const checked = checkCharge(req.body);
 * if (refuseInvalid(res, checked)) return;
 * ```
 */
export function refuseInvalid<T>(
  res: Response,
  checked: Checked<T>,
): checked is { ok: false; detail: string; invalid: string[] } {
  if (checked.ok) return false;
  sendProblem(res, 'validation_failed', checked.detail, { invalid: checked.invalid });
  return true;
}
