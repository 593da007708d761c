import { Buffer } from 'node:buffer';
import { isFieldValue, isHttpToken } from './header-syntax.js';
import { isPlainObject } from './plain-object.js';
import type { StoredResponse } from './store.js';

/**
 * The engine's refusal of a response no store could keep and give back as it was: a status outside
 * 100–599 or not an integer, headers that are not a plain object of HTTP field values, a body that is
 * not a `Uint8Array`. The store is never called, so nothing is written. It is a `TypeError`: misuse
 * by the caller, never an outage. The engine reports it in a `store-error` event and releases the
 * key, so a retry runs the handler again (in transactional mode the transaction rolls back).
 * {@link assertStoredResponse} throws it.
 *
 * @example
 * const result = await engine.complete(lease, { status: 200, headers: {}, body: 'text' as never });
 * if (!result.ok && (result.error as InvalidResponseError).code === 'response_invalid') log.error('handler bug');
 */
export class InvalidResponseError extends TypeError {
  override readonly name = 'InvalidResponseError' as const;
  readonly code = 'response_invalid' as const;
}

/**
 * Thrown (or rejected with) by a store's `complete()` for a response bigger than the store's
 * `maxResponseBytes`, measured by {@link storedResponseSize}. Nothing is written. The engine reports
 * it in a `store-error` event and releases the key. The adapters never hand a store such a response
 * when the store declares its cap (`Store.maxResponseBytes`): they settle it as too large to replay.
 *
 * @example
 * const result = await engine.complete(lease, response);
 * if (!result.ok && isResponseTooLargeError(result.error)) log.warn({ bytes: result.error.bytes }, 'not stored');
 */
export class ResponseTooLargeError extends Error {
  override readonly name = 'ResponseTooLargeError' as const;
  readonly code = 'response_too_large' as const;
  /**
   * Size of the response as {@link storedResponseSize} measures it (status, headers and body), from
   * every store of this project, `memoryStore` included.
   */
  readonly bytes: number;
  /** The store's `maxResponseBytes` (`memoryStore`'s `maxBytes`, the budget a single record is over). */
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
 * const engine = createIdempotency({
 *   store,
 *   onEvent: (event) => {
 *     if (event.type === 'store-error' && isResponseTooLargeError(event.error)) metrics.increment('idem.response_not_stored');
 *   },
 * });
 */
export function isResponseTooLargeError(value: unknown): value is ResponseTooLargeError {
  return (
    value instanceof Error &&
    value.name === 'ResponseTooLargeError' &&
    (value as ResponseTooLargeError).code === 'response_too_large'
  );
}

/**
 * The default `maxResponseBytes` of the Redis and PostgreSQL stores: 4 MiB.
 *
 * @example
 * const maxBytes = responseLimit(options.maxResponseBytes, 512 * 1024 * 1024, 'maxResponseBytes');
 */
export const defaultMaxResponseBytes = 4 * 1024 * 1024;

/**
 * Checks a store's size cap option once, at construction: `undefined` gives
 * {@link defaultMaxResponseBytes}; anything but an integer from 1 to `ceiling` (what the backend can
 * hold and read back) throws a `TypeError` naming the option.
 *
 * @example
 * const maxResponseBytes = responseLimit(options.maxResponseBytes, REDIS_STRING_LIMIT, 'maxResponseBytes');
 */
export function responseLimit(value: number | undefined, ceiling: number, name: string): number {
  const limit = value ?? defaultMaxResponseBytes;
  if (!Number.isInteger(limit) || limit < 1 || limit > ceiling) {
    throw new TypeError(`${name} must be an integer from 1 to ${ceiling}`);
  }
  return limit;
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
  const size = FRAMING_BYTES + Buffer.byteLength(JSON.stringify(response.headers)) + response.body.byteLength;
  // A reason phrase of the handler's own is one more member in the same JSON: `,"m":` and the string.
  const message = response.statusMessage;
  return message === undefined ? size : size + MESSAGE_FRAMING_BYTES + Buffer.byteLength(JSON.stringify(message));
}

const MESSAGE_FRAMING_BYTES = 5;

/**
 * The size of `response` as {@link storedResponseSize} measures it, when that is over `limit`; else
 * undefined. Every completion asks this of a response far below its store's cap (twice on the memory
 * store: the adapter's check in advance, then the store's), and the exact measure writes the headers
 * as JSON each time. Here they are written only when an upper bound of the size is over the limit,
 * so the answer is the exact measure's, at a fraction of its cost.
 *
 * @example
 * sizeOverLimit({ status: 201, headers: {}, body: new Uint8Array(3) }, 10); // 20
 */
export function sizeOverLimit(response: StoredResponse, limit: number): number | undefined {
  if (sizeBound(response) <= limit) return undefined;
  const size = storedResponseSize(response);
  return size > limit ? size : undefined;
}

// A bound of storedResponseSize: JSON writes a UTF-16 code unit in at most 6 bytes of UTF-8 (its
// longest escape, `\u001f`, or a lone surrogate's; a character takes at most 3 bytes, a pair 4), and
// each member adds its two pairs of quotes, a colon and a comma. Anything but string values (which
// JSON.stringify may write otherwise, or call a toJSON of) gets no bound: measured exactly.
function sizeBound(response: StoredResponse): number {
  const headers = response.headers;
  if (typeof (headers as { toJSON?: unknown }).toJSON === 'function') return Number.POSITIVE_INFINITY;
  let bound = FRAMING_BYTES + 2 + response.body.byteLength;
  // Inherited members only make the bound larger, never wrong.
  for (const name in headers) {
    const value: unknown = headers[name];
    if (typeof value !== 'string') return Number.POSITIVE_INFINITY;
    bound += 6 * (name.length + value.length) + 6;
  }
  const message: unknown = response.statusMessage;
  if (message === undefined) return bound;
  return typeof message === 'string'
    ? bound + MESSAGE_FRAMING_BYTES + 6 * message.length + 2
    : Number.POSITIVE_INFINITY;
}

/** Options of {@link assertStoredResponse}. */
export interface StoredResponseLimits {
  /** A store's `maxResponseBytes`: a bigger response throws {@link ResponseTooLargeError}. */
  maxBytes?: number | undefined;
}

/**
 * The check the engine runs on every response before it hands it to a store (`engine.complete()`
 * and transactional mode alike): throws {@link InvalidResponseError} for a response no store could
 * keep and replay as it was, and, given `limits.maxBytes`, {@link ResponseTooLargeError} for one
 * over it. Stores need not call it; one that is also called without the engine may.
 *
 * A response is storable when its status is an integer from 100 to 599, its headers a plain object
 * whose names are HTTP tokens and whose values are strings that are HTTP field values, and its body a
 * `Uint8Array` (a `Buffer` is one), and its `statusMessage`, when it has one, a string of
 * field-value characters. Each rule is what some store or the replay needs: PostgreSQL
 * keeps the status in an `integer` column and refuses a NUL in `jsonb`; Redis reads back only string
 * headers; a `Map` of headers would be stored as `{}`; Node refuses to write a header with a line
 * break. Written anyway, such a record would fail every read or replay of its key until its retention
 * ends, so it is refused up front, the same way whatever the store.
 *
 * @example
 * assertStoredResponse({ status: 201, headers: { location: '/a\r\nb' }, body }); // throws InvalidResponseError
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
  // Of any realm (a vm context's too); not an array, Map, Headers, class
  // instance or object over a plain one, whose entries a store would drop without a word.
  if (!isPlainObject(headers)) throw new InvalidResponseError('response headers must be a plain object');
  for (const name of Object.keys(headers)) checkHeader(name, headers[name]);
  if (!(body instanceof Uint8Array)) throw new InvalidResponseError('response body must be a Uint8Array');
  // Node refuses to write a reason phrase with a line break, as it refuses such a header value.
  const { statusMessage } = response as Partial<StoredResponse>;
  if (statusMessage !== undefined && (typeof statusMessage !== 'string' || !isFieldValue(statusMessage))) {
    throw new InvalidResponseError('response statusMessage must be a string of HTTP field-value characters');
  }
  const { maxBytes } = limits;
  if (maxBytes !== undefined) {
    const bytes = sizeOverLimit(response as StoredResponse, maxBytes);
    if (bytes !== undefined) throw new ResponseTooLargeError(bytes, maxBytes);
  }
}

// The checks Node's `writeHead` applies (RFC 9110: a name is a token; a value is visible ASCII,
// obs-text, spaces and tabs), so a header that passes them can always be replayed; written locally
// (header-syntax.ts) so the engine needs no node:http on Workers. Node takes a number or an array as
// a value too; a store reads back only strings, so those are refused here.
const checkHeader = (name: string, value: unknown) => {
  if (!isHttpToken(name)) throw new InvalidResponseError('a response header name is not an HTTP token');
  if (typeof value !== 'string' || !isFieldValue(value)) {
    throw new InvalidResponseError('a response header value is not a string of HTTP field-value characters');
  }
};
