import { problemType } from '@idem/core';

/**
 * Every error code of @idem/webhooks, with the status a receiver answers with. Callers match on
 * `code`, never on messages.
 *
 * Verification failures are 400 (the sender or an attacker sent something wrong). Misconfiguration of
 * the receiving server itself (a body that was already parsed, a bad secret) is 500 on purpose: the
 * sender keeps retrying, so the events are not lost while the deployment is fixed.
 *
 * @example
 * webhookErrorTable.signature_mismatch.status; // 400
 */
export const webhookErrorTable = {
  headers_missing: { status: 400, title: 'Webhook headers are missing', retryable: false },
  header_invalid: { status: 400, title: 'A webhook header is malformed', retryable: false },
  timestamp_too_old: { status: 400, title: 'Webhook timestamp is too old', retryable: false },
  timestamp_too_new: { status: 400, title: 'Webhook timestamp is in the future', retryable: false },
  signature_unsupported: { status: 400, title: 'No webhook signature of a supported version', retryable: false },
  signature_mismatch: { status: 400, title: 'No webhook signature matches', retryable: false },
  event_id_reused: { status: 422, title: 'Webhook id already used for another payload', retryable: false },
  body_too_large: { status: 413, title: 'Webhook body too large', retryable: false },
  body_encoding_unsupported: { status: 415, title: 'Webhook body encoding unsupported', retryable: false },
  body_incomplete: { status: 400, title: 'Webhook body cut short', retryable: true },
  apply_failed: { status: 500, title: 'Webhook could not be applied', retryable: true },
  raw_body_required: { status: 500, title: 'Webhook raw body required', retryable: true },
  secret_invalid: { status: 500, title: 'Webhook secret is invalid', retryable: false },
  relay_round_timeout: { status: 503, title: 'Outbox relay round outlived its lease', retryable: true },
  event_id_contended: { status: 503, title: 'Outbox id deleted under add() each time', retryable: true },
} as const;

/** A stable @idem/webhooks error code. */
export type WebhookErrorCode = keyof typeof webhookErrorTable;

/** Options of a {@link WebhookError}. */
export interface WebhookErrorOptions {
  cause?: unknown;
  /** Non-secret facts for logs, such as body lengths. Never keys, signatures or payloads. */
  details?: Record<string, string | number | boolean> | undefined;
}

/**
 * The one error class of @idem/webhooks. Verification returns it inside `{ ok: false }`; it is thrown
 * only for misuse (a parsed body where raw bytes are needed, an invalid secret), by an outbox `add()` of
 * an id the outbox already holds with another event (`event_id_reused`, the sender's side of the
 * receiver's answer) or whose row others kept adding and deleting while it looked (`event_id_contended`),
 * and by an outbox relay round that outlived its lease (`relay_round_timeout`).
 *
 * Messages are written from fixed text and never contain secrets, signatures or payloads.
 *
 * @example
 * const error = new WebhookError('raw_body_required', 'Pass the raw request body (a Buffer), not a parsed object.');
 * error.status; // 500
 * error.toProblem().type; // 'https://idem.dev/problems/raw-body-required'
 */
export class WebhookError extends Error {
  override readonly name = 'WebhookError' as const;
  readonly code: WebhookErrorCode;
  readonly status: number;
  readonly retryable: boolean;
  readonly details: Readonly<Record<string, string | number | boolean>>;

  constructor(code: WebhookErrorCode, detail: string, options: WebhookErrorOptions = {}) {
    super(detail, options.cause === undefined ? undefined : { cause: options.cause });
    const row = webhookErrorTable[code];
    this.code = code;
    this.status = row.status;
    this.retryable = row.retryable;
    this.details = Object.freeze({ ...options.details });
  }

  /** The RFC 9457 problem body for this error. */
  toProblem(): {
    type: string;
    title: string;
    status: number;
    detail: string;
    code: WebhookErrorCode;
    retryable: boolean;
  } {
    return {
      type: problemType(this.code),
      title: webhookErrorTable[this.code].title,
      status: this.status,
      detail: this.message,
      code: this.code,
      retryable: this.retryable,
    };
  }
}

/**
 * True when `value` is a {@link WebhookError} (works across copies of the package).
 *
 * @example
 * try { verifier.verify({ headers, body: req.body }); } catch (error) {
 *   if (isWebhookError(error) && error.code === 'raw_body_required') console.error(error.message);
 * }
 */
export function isWebhookError(value: unknown): value is WebhookError {
  return value instanceof Error && value.name === 'WebhookError' && typeof (value as WebhookError).code === 'string';
}
