/**
 * Every error code idem can produce, with the HTTP status an adapter answers with.
 * Callers match on `code`, never on messages. The table is the single source of truth for statuses.
 */
export const errorTable = {
  key_missing: { status: 400, title: 'Idempotency-Key is missing', retryable: false },
  key_invalid: { status: 400, title: 'Idempotency-Key is malformed', retryable: false },
  fingerprint_mismatch: {
    status: 422,
    title: 'Idempotency-Key is already used with another request',
    retryable: false,
  },
  idempotency_error: { status: 400, title: 'Idempotency-Key is already used with another request', retryable: false },
  in_progress: { status: 409, title: 'A request is outstanding for this Idempotency-Key', retryable: true },
  store_unavailable: { status: 503, title: 'Idempotency store unavailable', retryable: true },
  body_too_large: { status: 413, title: 'Request body too large', retryable: false },
  body_incomplete: { status: 400, title: 'Request body incomplete', retryable: true },
  scope_missing: { status: 500, title: 'No idempotency scope for this request', retryable: false },
  lease_lost: {
    status: 503,
    title: 'This execution lost its hold on the Idempotency-Key',
    retryable: true,
  },
  response_not_replayable: {
    status: 500,
    title: 'The response of this Idempotency-Key cannot be replayed',
    retryable: false,
  },
  // The handler's bug, not the store's: the key is released, but the same request fails the same way
  // until the server is fixed, so a client is not told to retry.
  transaction_aborted: {
    status: 500,
    title: "The handler's transaction was aborted",
    retryable: false,
  },
} as const;

/** A stable idem error code. */
export type IdempotencyErrorCode = keyof typeof errorTable;

/** Base of the problem `type` URIs; each code's URI is documented in docs/errors.md. */
export const problemTypeBase = 'https://idem.dev/problems/';

/** The RFC 9457 problem type URI of an error code, e.g. `https://idem.dev/problems/in-progress`. */
export function problemType(code: string): string {
  return problemTypeBase + code.replaceAll('_', '-');
}

/** An RFC 9457 problem details body, with idem's `code` and `retryable` extensions. */
export interface ProblemDetails {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: string;
  retryable: boolean;
  [extension: string]: unknown;
}

/** Options of an {@link IdempotencyError}. */
export interface IdempotencyErrorOptions {
  /** Overrides the status of the error table (used for the 400 `idempotency_error` mismatch mode). */
  status?: number | undefined;
  /** Seconds a client should wait before retrying (409 and 503). */
  retryAfter?: number | undefined;
  cause?: unknown;
}

/**
 * The one error class of idem's idempotency layer. `begin()` returns it inside `{ kind: 'reject' }`;
 * adapters turn it into a response with {@link IdempotencyError.toProblem}.
 *
 * Messages never contain keys, tokens or payloads: they are written from a fixed table.
 *
 * @example
 * const error = new IdempotencyError('in_progress', 'The first request with this key is still running.', { retryAfter: 1 });
 * error.toProblem(); // { type: 'https://idem.dev/problems/in-progress', status: 409, code: 'in_progress', ... }
 */
export class IdempotencyError extends Error {
  override readonly name = 'IdempotencyError' as const;
  readonly code: IdempotencyErrorCode;
  readonly status: number;
  readonly retryable: boolean;
  readonly retryAfter: number | undefined;

  constructor(code: IdempotencyErrorCode, detail: string, options: IdempotencyErrorOptions = {}) {
    super(detail, options.cause === undefined ? undefined : { cause: options.cause });
    const row = errorTable[code];
    this.code = code;
    this.status = options.status ?? row.status;
    this.retryable = row.retryable;
    this.retryAfter = options.retryAfter;
  }

  /** The RFC 9457 body for this error; its `code` is this error's, typed as the union to switch on. */
  toProblem(): ProblemDetails & { code: IdempotencyErrorCode } {
    return {
      type: problemType(this.code),
      title: errorTable[this.code].title,
      status: this.status,
      detail: this.message,
      code: this.code,
      retryable: this.retryable,
    };
  }
}

/** True when `value` is an {@link IdempotencyError} (works across copies of the package). */
export function isIdempotencyError(value: unknown): value is IdempotencyError {
  return (
    value instanceof Error && value.name === 'IdempotencyError' && typeof (value as IdempotencyError).code === 'string'
  );
}

/**
 * Thrown by stores when the backing service cannot be reached or fails mid-operation.
 * The engine turns it into a `store_unavailable` rejection (503 + Retry-After).
 */
export class StoreUnavailableError extends Error {
  override readonly name = 'StoreUnavailableError' as const;
  readonly code = 'store_unavailable' as const;
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options === undefined ? undefined : { cause: withoutCommandValues(options.cause) });
  }
}

/**
 * True when `value` is a {@link StoreUnavailableError}: the one test of it the packages use (the HTTP
 * adapters, the webhook receiver, `@idem/postgres`). By name, so one raised by another copy of
 * `@idem/core` (a store built against it) is recognised too, where `instanceof` is not.
 *
 * @example
 * if (isStoreUnavailableError(error)) return answer503(error);
 */
export function isStoreUnavailableError(value: unknown): value is StoreUnavailableError {
  return value instanceof Error && value.name === 'StoreUnavailableError';
}

/**
 * Thrown by a store whose claim could not settle because the record kept changing under it (freed
 * and taken again between its reads, time after time): the store answered, and the key is live
 * elsewhere. Not a {@link StoreUnavailableError}: under `storeUnavailable: 'fail-open'` running the
 * request unprotected would run a duplicate beside a live holder, so it fails closed. At the claim
 * the engine answers it as any claim error, 503 `store_unavailable` with `Retry-After`.
 *
 * @example
 * throw new StoreContendedError('Redis claim kept racing with releases; retry');
 */
export class StoreContendedError extends Error {
  override readonly name = 'StoreContendedError' as const;
  readonly code = 'store_contended' as const;
}

/**
 * True when `value` is a {@link StoreContendedError}. By name, so one raised by another copy of
 * `@idem/core` (a store built against it) is recognised too.
 *
 * @example
 * if (isStoreContendedError(error)) metrics.increment('idem.claim.contended');
 */
export function isStoreContendedError(value: unknown): value is StoreContendedError {
  return value instanceof Error && value.name === 'StoreContendedError';
}

/**
 * Thrown by a transactional store when the handler left its transaction aborted: a statement of
 * the handler's failed and the handler went on (a unique violation caught and ignored, without a
 * SAVEPOINT), so PostgreSQL refuses everything until the transaction ends (SQLSTATE 25P02), the
 * record's completion included; or when PostgreSQL refused the handler's writes at COMMIT (a
 * deferred unique or foreign key, a constraint trigger). Nothing of the transaction commits. It is the handler's failure,
 * not the store's: the engine rethrows it as it would the handler's own error (no `store-error`),
 * the HTTP adapters answer 500 `transaction_aborted` and release the key, and the webhook receiver
 * answers 500 `apply_failed`. `cause` is the database's error.
 *
 * @example
 * try {
 *   await engine.transaction(lease, handler);
 * } catch (error) {
 *   if (isTransactionAbortedError(error)) log.error({ error }, 'use a SAVEPOINT or ON CONFLICT DO NOTHING');
 * }
 */
export class TransactionAbortedError extends Error {
  override readonly name = 'TransactionAbortedError' as const;
  readonly code = 'transaction_aborted' as const;
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options === undefined ? undefined : { cause: withoutCommandValues(options.cause) });
  }
}

/**
 * True when `value` is a {@link TransactionAbortedError}. By name, so one raised by another copy of
 * `@idem/core` (a store built against it) is recognised too.
 *
 * @example
 * if (isTransactionAbortedError(error)) metrics.increment('handler.transaction_aborted');
 */
export function isTransactionAbortedError(value: unknown): value is TransactionAbortedError {
  return value instanceof Error && value.name === 'TransactionAbortedError';
}

/**
 * Takes off a database driver's error the values of the command that failed, which drivers attach
 * for debugging: ioredis's `command.args` (the name stays) and PGlite's `params` (the statement's
 * text stays). Those values are what a store writes, a response body included, and the error goes
 * on to store-error events and from there to logs. Returns the same error, trimmed in place; any
 * other value is returned as it is. Store authors: pass a driver's error through it before
 * wrapping or rethrowing it.
 *
 * @example
 * try {
 *   await redis.eval(claimScript, 1, key, record);
 * } catch (error) {
 *   throw new StoreUnavailableError('claim failed', { cause: withoutCommandValues(error) });
 * }
 */
export function withoutCommandValues<T>(error: T): T {
  if (error === null || typeof error !== 'object') return error;
  const trimmed = error as { command?: unknown; params?: unknown };
  try {
    const command = trimmed.command;
    if (command !== null && typeof command === 'object' && 'args' in command) {
      trimmed.command = { name: (command as { name?: unknown }).name };
    }
    if ('params' in trimmed) delete trimmed.params;
  } catch {
    // A frozen error cannot be trimmed: it is passed on as it is.
  }
  return error;
}
