/**
 * Rejects `complete()` when an encoded response is bigger than the store's `maxResponseBytes`.
 * Nothing is written. The engine then reports a `store-error` event carrying this error and releases
 * the key. The adapter still sends the response to the client; it is just not stored, so a retry
 * runs the handler again instead of replaying.
 *
 * @example
 * const result = await engine.complete(lease, response);
 * if (!result.ok && isResponseTooLargeError(result.error)) log.warn({ bytes: result.error.bytes }, 'not stored');
 */
export class ResponseTooLargeError extends Error {
  override readonly name = 'ResponseTooLargeError' as const;
  readonly code = 'response_too_large' as const;
  /** Size of the encoded response (status, headers and body). */
  readonly bytes: number;
  /** The store's `maxResponseBytes`. */
  readonly limit: number;

  constructor(bytes: number, limit: number) {
    super(`The response is ${bytes} bytes encoded, over the store limit of ${limit}; it was not stored.`);
    this.bytes = bytes;
    this.limit = limit;
  }
}

/**
 * True when `value` is a {@link ResponseTooLargeError} (works across copies of the package).
 *
 * @example
 * if (isResponseTooLargeError(error)) metrics.increment('idem.response_not_stored');
 */
export function isResponseTooLargeError(value: unknown): value is ResponseTooLargeError {
  return (
    value instanceof Error &&
    value.name === 'ResponseTooLargeError' &&
    (value as ResponseTooLargeError).code === 'response_too_large'
  );
}
