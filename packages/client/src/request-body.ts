/**
 * A request body once encoded: sent as-is on every attempt.
 *
 * @example
 * const { body, contentType } = await encodeBody({ amount: 500 });
 */
export interface EncodedBody {
  body: BodyInit | undefined;
  /** Set when the client chose the encoding (JSON, or FormData's multipart with its boundary). */
  contentType: string | undefined;
}

const isInstance = (value: unknown, name: 'Blob' | 'FormData' | 'URLSearchParams' | 'ReadableStream'): boolean => {
  // Looked up at call time so the module loads in runtimes that lack one of these classes.
  const ctor = (globalThis as Record<string, unknown>)[name];
  return typeof ctor === 'function' && value instanceof (ctor as new (...args: never[]) => unknown);
};

// A body that can be read only once: a web ReadableStream, a Node stream (fetch in Node accepts
// both), or any async iterable. JSON.stringify would send their internals instead of their bytes.
function isOneShot(value: unknown): boolean {
  if (isInstance(value, 'ReadableStream')) return true;
  if (typeof value !== 'object' || value === null) return false;
  return Symbol.asyncIterator in value || typeof (value as { pipe?: unknown }).pipe === 'function';
}

/**
 * Encodes a request body once, so every attempt sends the very same bytes (a server comparing
 * fingerprints then sees one request, not several). Strings, bytes, `Blob` and `URLSearchParams` are
 * sent as they are; `FormData` is serialised once here, because `fetch` would draw a new multipart
 * boundary on every attempt; `undefined` sends no body; anything else is JSON. A stream (web or
 * Node) or an async iterable is refused with a `TypeError`: it can be read only once, so it cannot
 * be retried.
 *
 * @example
 * await encodeBody({ amount: 500 }); // { body: '{"amount":500}', contentType: 'application/json' }
 */
export async function encodeBody(value: unknown): Promise<EncodedBody> {
  if (value === undefined) return { body: undefined, contentType: undefined };
  if (isOneShot(value)) {
    throw new TypeError('a stream body can be read only once and so cannot be retried: pass a string, bytes or a Blob');
  }
  if (isInstance(value, 'FormData')) {
    const multipart = new Response(value as FormData);
    return {
      body: new Uint8Array(await multipart.arrayBuffer()),
      contentType: multipart.headers.get('content-type') ?? undefined,
    };
  }
  if (
    typeof value === 'string' ||
    value instanceof ArrayBuffer ||
    ArrayBuffer.isView(value) ||
    isInstance(value, 'Blob') ||
    isInstance(value, 'URLSearchParams')
  ) {
    return { body: value as BodyInit, contentType: undefined };
  }
  const json = JSON.stringify(value);
  if (json === undefined) throw new TypeError('the body cannot be encoded as JSON');
  return { body: json, contentType: 'application/json' };
}
