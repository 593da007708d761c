import { type IdempotencyError, isIdempotencyError } from './errors.js';
import type { HttpResponse, IdempotencyContext } from './http-types.js';

/**
 * The answer to an {@link IdempotencyError}: its status, `Retry-After` when it has one, and its RFC
 * 9457 problem as `application/problem+json`, never cached. Every adapter answers idem's errors with
 * these bytes.
 *
 * @example
 * writeResponse(res, problemResponse(new IdempotencyError('in_progress', 'Still running.', { retryAfter: 1 })));
 */
export function problemResponse(error: IdempotencyError): HttpResponse {
  const headers: Record<string, string> = { 'content-type': 'application/problem+json' };
  if (error.retryAfter !== undefined) headers['retry-after'] = String(error.retryAfter);
  // Problem answers are about this attempt only; nothing in between may cache them.
  headers['cache-control'] = 'no-store';
  return { status: error.status, headers, body: Buffer.from(JSON.stringify(error.toProblem())) };
}

/**
 * True for the reason a lease's `signal` aborts with once the execution lost the key (`lease_lost`):
 * what a handler that stops on the signal throws. Given `context` (the request's
 * `IdempotencyContext`), true only for that execution's own reason: the adapters answer it as a
 * problem (503 with `Retry-After`), and only it. Another request's reason, rethrown by this handler
 * (a shared in-flight call), is this handler's failure, not a lost lease of its own: answered as a
 * problem it would be stored as the outcome, and its retries replayed "retry later" for ever.
 *
 * @example
 * try { req.idempotency?.signal.throwIfAborted(); } catch (error) { if (isLeaseLost(error)) return; }
 */
export function isLeaseLost(error: unknown, context?: Pick<IdempotencyContext, 'signal'>): error is IdempotencyError {
  if (!isIdempotencyError(error) || error.code !== 'lease_lost') return false;
  return context === undefined || context.signal.reason === error;
}
