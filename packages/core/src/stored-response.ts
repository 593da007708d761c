import { Buffer } from 'node:buffer';
import type { StoredResponse } from './store.js';

/**
 * Thrown (or rejected with) by a store's `complete()` for a response it could not keep and give
 * back as it was: a status outside 100–599 or not an integer, headers that are not a plain object of
 * HTTP field values, a body that is not a `Uint8Array`. Nothing is written. It is a `TypeError`:
 * misuse by the caller, never an outage. The engine reports it in a `store-error` event and releases
 * the key, so a retry runs the handler again.
 *
 * @example
 * try {
 *   await store.complete({ id, token, response: { status: 200, headers: {}, body: 'text' as never }, retentionMs });
 * } catch (error) {
 *   if ((error as InvalidResponseError).code === 'response_invalid') log.error({ error }, 'handler bug');
 * }
 */
export class InvalidResponseError extends TypeError {
  override readonly name = 'InvalidResponseError' as const;
  readonly code = 'response_invalid' as const;
}

/**
 * Thrown (or rejected with) by a store's `complete()` for a response bigger than the store's
 * `maxResponseBytes`, measured by {@link storedResponseSize}. Nothing is written. The engine reports
 * it in a `store-error` event and releases the key; the adapter still sends the response to the
 * client. It is just not stored, so a retry runs the handler again instead of replaying.
 *
 * @example
 * const result = await engine.complete(lease, response);
 * if (!result.ok && isResponseTooLargeError(result.error)) log.warn({ bytes: result.error.bytes }, 'not stored');
 */
export class ResponseTooLargeError extends Error {
  override readonly name = 'ResponseTooLargeError' as const;
  readonly code = 'response_too_large' as const;
  /** Size of the response as {@link storedResponseSize} measures it (status, headers and body). */
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
 * if (isResponseTooLargeError(event.error)) metrics.increment('idem.response_not_stored');
 */
export function isResponseTooLargeError(value: unknown): value is ResponseTooLargeError {
  return (
    value instanceof Error &&
    value.name === 'ResponseTooLargeError' &&
    (value as ResponseTooLargeError).code === 'response_too_large'
  );
}

// Framing of status and headers: `{"s":` + three digits + `,"h":` ... `}` and a newline. It is the
// Redis store's layout byte for byte (its codec test holds it to that), so the Redis limit measures
// what Redis keeps; the other stores measure the same way, so one response fits all or none.
const FRAMING_BYTES = 15;

/**
 * The size of a response as every store measures it against its `maxResponseBytes`: the body, the
 * headers written as JSON, and 15 bytes for the status and framing. Call it on a response
 * {@link assertStoredResponse} accepted.
 *
 * @example
 * storedResponseSize({ status: 201, headers: {}, body: new Uint8Array(3) }); // 20
 */
export function storedResponseSize(response: StoredResponse): number {
  return FRAMING_BYTES + Buffer.byteLength(JSON.stringify(response.headers)) + response.body.byteLength;
}

/** Options of {@link assertStoredResponse}. */
export interface StoredResponseLimits {
  /** The store's `maxResponseBytes`: a bigger response throws {@link ResponseTooLargeError}. */
  maxBytes?: number;
}

// RFC 9110 field names are tokens; values are visible ASCII, obs-text, spaces and tabs. These are
// the checks Node applies in writeHead, so a stored header that passes them can always be replayed.
const FIELD_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const NOT_FIELD_VALUE = /[^\t\x20-\x7e\x80-\xff]/;

/**
 * The check every store runs in `complete()` before it writes anything: throws
 * {@link InvalidResponseError} for a response it could not keep and replay as it was, and
 * {@link ResponseTooLargeError} for one over `limits.maxBytes`.
 *
 * A response is storable when its status is an integer from 100 to 599, its headers a plain object
 * whose names are HTTP tokens and whose values are strings that are HTTP field values, and its body a
 * `Uint8Array` (a `Buffer` is one). Each rule is what some store or the replay needs: PostgreSQL
 * keeps the status in an `integer` column and refuses a NUL in `jsonb`; Redis reads back only string
 * headers; a `Map` of headers would be stored as `{}`; Node refuses to write a header with a line
 * break. Written anyway, such a record would fail every read or replay of its key until its retention
 * ends, so it is refused up front, the same way by every store.
 *
 * @example
 * complete: async ({ id, token, response, retentionMs }) => {
 *   assertStoredResponse(response, { maxBytes: 4 * 1024 * 1024 });
 *   // ... write it
 * }
 */
export function assertStoredResponse(
  response: unknown,
  limits: StoredResponseLimits = {},
): asserts response is StoredResponse {
  if (typeof response !== 'object' || response === null) throw new InvalidResponseError('response must be an object');
  const { status, headers, body } = response as Partial<StoredResponse>;
  if (typeof status !== 'number' || !Number.isInteger(status) || status < 100 || status > 599) {
    throw new InvalidResponseError('response status must be an integer from 100 to 599');
  }
  if (!isPlainObject(headers)) throw new InvalidResponseError('response headers must be a plain object');
  for (const name of Object.keys(headers)) {
    const value = headers[name];
    if (!FIELD_NAME.test(name)) throw new InvalidResponseError('a response header name is not an HTTP token');
    if (typeof value !== 'string' || NOT_FIELD_VALUE.test(value)) {
      throw new InvalidResponseError('a response header value is not a string of HTTP field-value characters');
    }
  }
  if (!(body instanceof Uint8Array)) throw new InvalidResponseError('response body must be a Uint8Array');
  const { maxBytes } = limits;
  if (maxBytes !== undefined) {
    const bytes = storedResponseSize(response as StoredResponse);
    if (bytes > maxBytes) throw new ResponseTooLargeError(bytes, maxBytes);
  }
}

// An object literal or JSON.parse result, from this realm or another (its prototype's prototype is
// null), or a null-prototype object: not an array, Map, Headers or class instance, whose entries a
// store would drop without a word.
const isPlainObject = (value: unknown): value is Record<string, unknown> => {
  if (typeof value !== 'object' || value === null) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === null || Object.getPrototypeOf(proto) === null;
};
