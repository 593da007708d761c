export type { RequestBodyFacts } from './body-refusal.js';
export { canonicalJson } from './canonical-json.js';
export { decoderOf } from './content-coding.js';
export { type DownstreamKeySource, downstreamKey } from './downstream-key.js';
export { type Duration, toMilliseconds } from './duration.js';
export { createIdempotency } from './engine.js';
export type { IdempotencyOptions } from './engine-options.js';
export type {
  BeginInput,
  BeginResult,
  CompleteResult,
  IdempotencyEngine,
  Lease,
  ReleaseResult,
  TransactionResult,
  UnprotectedResult,
} from './engine-types.js';
export {
  errorTable,
  IdempotencyError,
  type IdempotencyErrorCode,
  type IdempotencyErrorOptions,
  isIdempotencyError,
  isStoreContendedError,
  isStoreUnavailableError,
  isTransactionAbortedError,
  type ProblemDetails,
  problemType,
  problemTypeBase,
  StoreContendedError,
  StoreUnavailableError,
  TransactionAbortedError,
  withoutCommandValues,
} from './errors.js';
export type {
  IdempotencyEvent,
  IdempotencyEventType,
  LeaseLostReason,
  NotStoredReason,
  RefusalCode,
} from './events.js';
export {
  type FingerprintOptions,
  fingerprintRequest,
  fingerprintsMatch,
  isJsonContentType,
  jsonBodyText,
  type RequestParts,
} from './fingerprint.js';
export {
  type BodyRead,
  carriesBody,
  decodeRequestBody,
  type ParsedBodyFields,
  parsedBodyRead,
  type ReadBodyResult,
  readBodyForFingerprint,
  readRequestBody,
  readStream,
} from './http-body.js';
export { createHttpIdempotency } from './http-idempotency.js';
export {
  defaultReplayHeaders,
  type HttpFingerprintOptions,
  type HttpFingerprintSettings,
  type HttpIdempotencyOptions,
} from './http-options.js';
export { isLeaseLost, problemResponse } from './http-problem.js';
export type {
  CaptureOptions,
  CaptureResult,
  HttpBeginResult,
  HttpIdempotency,
  HttpRequestInfo,
  HttpResponse,
  IdempotencyContext,
  ResponseCapture,
  RouteOverrides,
  RunningHandler,
} from './http-types.js';
export { connectionSpecificField, headerRecord, writeResponse } from './http-write.js';
export { type ParsedKey, type ParseKeyOptions, parseIdempotencyKey } from './key.js';
export {
  type IdempotentRun,
  isReplayedFailure,
  type MakeIdempotentOptions,
  makeIdempotent,
  type Replayed,
} from './make-idempotent.js';
export { type MemoryEviction, type MemoryStore, type MemoryStoreOptions, memoryStore } from './memory-store.js';
export { mintKey } from './mint.js';
export { notify } from './notify.js';
export { assertKnownOptions, type ListsEvery } from './option-names.js';
export { type Outcome, type OutcomeDecision, type OutcomePolicy, resolveOutcomePolicy } from './outcome-policy.js';
export { isPlainObject } from './plain-object.js';
export { type PrincipalScopeOptions, principalScope } from './principal-scope.js';
export { ownReasonPhrase } from './reason-phrase.js';
export { recordId } from './record-id.js';
export { clientLeft, destroyedOf } from './response-state.js';
export { retryWithPauses } from './retry-pauses.js';
export { foldRoutePath, normalisePercentEncoding, originForm, type RoutePathOptions } from './route-path.js';
export type {
  AsyncStore,
  Awaitable,
  ClaimInput,
  ClaimResult,
  CompleteInput,
  ForgetInput,
  ReleaseInput,
  RenewInput,
  Store,
  StoredResponse,
  StoreRecord,
} from './store.js';
export { isPending } from './store.js';
export { assertStoreId, assertStoreString } from './store-strings.js';
export type { StoreUnavailablePolicy } from './store-unavailable.js';
export {
  assertStoredResponse,
  defaultMaxResponseBytes,
  InvalidResponseError,
  isResponseTooLargeError,
  ResponseTooLargeError,
  responseLimit,
  type StoredResponseLimits,
  storedResponseSize,
} from './stored-response.js';
export { isTransactionalStore, type TransactionalStore } from './transactional.js';
export { markUnprotected, ranUnprotected } from './unprotected-mark.js';
