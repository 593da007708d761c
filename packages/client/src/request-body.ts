/**
 * A request body once encoded: sent as-is on every attempt.
 *
 * @example
 * const { body, contentType } = encodeBody({ amount: 500 });
 */
export interface EncodedBody {
  body: BodyInit | undefined;
  /** Set when the client chose the encoding (JSON); otherwise `fetch` derives it or the caller sets it. */
  contentType: string | undefined;
}

const isInstance = (value: unknown, name: 'Blob' | 'FormData' | 'URLSearchParams' | 'ReadableStream'): boolean => {
  // Looked up at call time so the module loads in runtimes that lack one of these classes.
  const ctor = (globalThis as Record<string, unknown>)[name];
  return typeof ctor === 'function' && value instanceof (ctor as new (...args: never[]) => unknown);
};

/**
 * Encodes a request body once, so every attempt sends the very same bytes (a server comparing
 * fingerprints then sees one request, not several). Strings, bytes, `Blob`, `FormData` and
 * `URLSearchParams` are sent as they are; `undefined` sends no body; anything else is JSON.
 * A `ReadableStream` is refused with a `TypeError`: it can be read only once, so it cannot be retried.
 *
 * @example
 * encodeBody({ amount: 500 }); // { body: '{"amount":500}', contentType: 'application/json' }
 */
export function encodeBody(value: unknown): EncodedBody {
  if (value === undefined) return { body: undefined, contentType: undefined };
  if (isInstance(value, 'ReadableStream')) {
    throw new TypeError('a stream body can be read only once and so cannot be retried: pass a string, bytes or a Blob');
  }
  if (
    typeof value === 'string' ||
    value instanceof ArrayBuffer ||
    ArrayBuffer.isView(value) ||
    isInstance(value, 'Blob') ||
    isInstance(value, 'FormData') ||
    isInstance(value, 'URLSearchParams')
  ) {
    return { body: value as BodyInit, contentType: undefined };
  }
  const json = JSON.stringify(value);
  if (json === undefined) throw new TypeError('the body cannot be encoded as JSON');
  return { body: json, contentType: 'application/json' };
}
