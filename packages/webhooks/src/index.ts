// The client's parser: delay-seconds of any length and all three HTTP-date forms (RFC 9110 5.6.7).
export { parseRetryAfter } from '@idem/client';
export { type Backoff, type BackoffOptions, createBackoff, seededRandom } from './backoff.js';
export { toBodyBytes, type WebhookBody } from './body.js';
export type { DeadLetterOptions, DeadLetterPage } from './dead-letters.js';
export {
  isWebhookError,
  WebhookError,
  type WebhookErrorCode,
  type WebhookErrorOptions,
  webhookErrorTable,
} from './errors.js';
export { type ExpressLikeRequest, expressWebhook } from './express.js';
export {
  type FastifyLikeInstance,
  type FastifyLikeReply,
  type FastifyLikeRequest,
  type FastifyWebhookOptions,
  fastifyWebhook,
  fastifyWebhookHandler,
} from './fastify.js';
export { fetchWebhook } from './fetch.js';
export type { GlueOptions } from './glue.js';
export {
  type HeaderInput,
  isValidWebhookId,
  type ParsedWebhookHeaders,
  parseWebhookHeaders,
  type WebhookHeaders,
} from './headers.js';
export { type KoaLikeContext, type KoaWebhookOptions, koaWebhook } from './koa.js';
export { createOutbox, type Outbox, type OutboxOptions } from './outbox.js';
export type { OutboxEvent } from './outbox-add.js';
export type { LostAttempt, OutboxRow } from './outbox-row.js';
export type { OutboxMigrateOptions } from './outbox-schema.js';
export type { PurgeOptions } from './purge.js';
export type { Queryable } from './queryable.js';
export { decodeBody, defaultBodyLimit, type RawBodyOptions, readRawBody } from './raw-body.js';
export {
  createReceiver,
  type ReceivedEvent,
  type Receiver,
  type ReceiverEvent,
  type ReceiverOptions,
  type ReceiverRequest,
  type ReceiverResponse,
  type ReceiverWarning,
} from './receiver.js';
export type { Relay, RelayRound } from './relay.js';
export type { RelayOptions } from './relay-options.js';
export {
  type GeneratedSecret,
  generateSecret,
  type ParsedSecret,
  parseSecret,
  parseSecrets,
  type SignatureVersion,
  type SigningKey,
  type VerifyingKey,
  type WebhookSecret,
} from './secrets.js';
export {
  type AttemptOptions,
  type AttemptRecord,
  createSender,
  type DeadLetterReason,
  type DeliveryResult,
  type ScheduleOptions,
  type Sender,
  type SenderOptions,
  type WebhookMessage,
} from './sender.js';
export {
  createSigner,
  createVerifier,
  type Signer,
  type SignerOptions,
  type SignInput,
  sign,
  type Tolerance,
  type VerifiedWebhook,
  type Verifier,
  type VerifierOptions,
  type VerifyInput,
  type VerifyResult,
  verify,
} from './signature.js';
