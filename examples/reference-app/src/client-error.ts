/**
 * The status of an error that blames the request: an http-errors 4xx with `expose` (its `status`, or
 * its `statusCode` when it has no `status`), as body-parser throws them (413 too large, 415 unsupported
 * charset or encoding, 400 unreadable or aborted), or the 400
 * URIError Express's router throws for a path parameter that does not percent-decode
 * (`/interaction/%zz`), which has no `expose`. Anything else is undefined and stays a 500, saying
 * nothing more.
 *
 * @example
 * ```ts
 * clientErrorStatus(Object.assign(new Error('request entity too large'), { status: 413, expose: true })); // 413
 * clientErrorStatus(new Error('bug')); // undefined
 * ```
 */
export function clientErrorStatus(error: unknown): number | undefined {
  if (typeof error !== 'object' || error === null) return undefined;
  const fields = error as { status?: unknown; statusCode?: unknown; expose?: unknown };
  // `status` first, then `statusCode`, as Express's final handler reads them (http-errors sets both).
  const status = fields.status !== undefined ? fields.status : fields.statusCode;
  const { expose } = fields;
  if (typeof status !== 'number' || !Number.isInteger(status) || status < 400 || status > 499) return undefined;
  if (expose === true) return status;
  return error instanceof URIError && status === 400 ? status : undefined;
}
