/**
 * How one attempt ended:
 * - `'response'`: a complete response arrived (any status).
 * - `'network-error'`: `fetch` failed or the connection broke before the whole body arrived.
 * - `'timeout'`: the per-attempt timeout (or the end of the total deadline) cut the attempt off.
 *
 * @example
 * if (attempt.outcome === 'timeout') metrics.increment('client.timeout');
 */
export type AttemptOutcome = 'response' | 'network-error' | 'timeout';

/**
 * One entry of the attempt history, in order. Times come from the client's clock (`now` option).
 *
 * @example
 * for (const a of result.attempts) console.log(a.number, a.outcome, a.status, a.waitMs);
 */
export interface Attempt {
  /** 1 for the first attempt. */
  readonly number: number;
  /** The key sent with this attempt (decoded), or `undefined` when it carried none. */
  readonly key: string | undefined;
  readonly startedAt: number;
  readonly durationMs: number;
  readonly outcome: AttemptOutcome;
  /** The response status, when there was a response. */
  readonly status: number | undefined;
  /** True when the response said `Idempotent-Replayed: true`: a stored outcome, not a new execution. */
  readonly replayed: boolean;
  /** The wait the server asked for with `Retry-After`, in milliseconds, when it sent one. */
  readonly retryAfterMs: number | undefined;
  /** The wait before the next attempt, in milliseconds; `undefined` on the last attempt. */
  readonly waitMs: number | undefined;
  /** What `fetch` threw, for network errors and timeouts. */
  readonly error: unknown;
}
