export { type JwsAlgorithm, jwsAlgorithms } from './algorithms.js';
export {
  type AuthorizationResult,
  type AuthorizeOptions,
  authorizeRequest,
  policy,
  type Requirement,
  requireAnyRole,
  requireAuthentication,
  requireRoles,
  requireScopes,
} from './authorization.js';
export { type ClaimValue, isNumericDate } from './claims.js';
export { defaultTokenLimits, type TokenLimits } from './compact-jws.js';
export type { DpopOptions } from './dpop.js';
export {
  GuardError,
  type GuardErrorCode,
  type GuardErrorOptions,
  type GuardProblem,
  guardErrorTable,
  isGuardError,
} from './errors.js';
export type { GuardEvent, GuardEventType, GuardStats } from './events.js';
export {
  extractBearerToken,
  type GuardRequest,
  guardRequestFromNode,
  hasQueryToken,
  type NodeRequestLike,
  type TokenExtraction,
} from './extract-token.js';
export { type ForwardOptions, forwardHeaders, joinHeaderValues, withoutHopByHop } from './forward-headers.js';
export { type GuardGlueOptions, optionalGuard } from './glue-options.js';
export { createGuard, type Guard, isGuard, type KeyRefresh } from './guard.js';
export type {
  GuardOptions,
  IssuerOptions,
  LocalJwks,
  PemKeyInput,
  PublicKeyInput,
  TokenRules,
} from './guard-options.js';
export { internalTokenType, normalizeTyp } from './guard-typ.js';
export { defaultInternalTokenHeader } from './internal-header.js';
export type { InternalSigningKey } from './internal-signing-keys.js';
export {
  createInternalTokenIssuer,
  type InternalTokenIssuer,
  type InternalTokenIssuerOptions,
} from './internal-token-issuer.js';
export { createInternalVerifier, type InternalVerifierOptions, verifyInternalToken } from './internal-verifier.js';
export type { KeyDropReason, KeySetRejection } from './key-import.js';
export type { RemoteJwksOptions } from './key-source.js';
export { type ClientCertificate, certificateThumbprint, type MtlsOptions } from './mtls.js';
export { type Principal, principalFromClaims } from './principal.js';
export { memoryReplayCache, type ReplayAnswer } from './replay-memory.js';
export { defaultIdentityHeaders, type StripOptions, stripIdentityHeaders } from './strip-headers.js';
export type { GuardResult } from './verify.js';
