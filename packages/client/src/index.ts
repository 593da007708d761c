export type { Attempt, AttemptOutcome } from './attempt.js';
export {
  type BackoffSchedule,
  backoffCeiling,
  backoffDelay,
  type Jitter,
  retryAfterSpread,
  retryWait,
} from './backoff.js';
export type {
  ClientOptions,
  HeaderValues,
  QueryValue,
  RequestOptions,
  RequestWithBodyOptions,
  RetryEvent,
  TokenContext,
} from './client-options.js';
export { type Client, type ClientResult, createClient } from './create-client.js';
export { type Duration, durationToMs } from './duration.js';
export {
  isRequestFailedError,
  type RequestFailedCode,
  type RequestFailedDetails,
  RequestFailedError,
  requestFailedCodes,
} from './errors.js';
export type { FetchFunction } from './fetch-function.js';
export { formatKeyField, type KeyFormat, newIdempotencyKey, parseKeyField } from './idempotency-key.js';
export type { ParseMode } from './response-body.js';
export { parseHttpDate, parseRetryAfter, retryAfterOf } from './retry-after.js';
export {
  isCertificateError,
  isHandshakeRefused,
  isIdempotentMethod,
  isProtocolMismatch,
  isRetryableStatus,
  isSafeToRepeat,
  type RetryContext,
  saysCertificateMissing,
  saysTokenInvalid,
} from './retry-decision.js';
export { type ResolvedRetry, type RetryOptions, resolveRetry, retryHorizonMs } from './retry-options.js';
export { abortableSleep, lateTimeout, maxTimerMs } from './sleep.js';
