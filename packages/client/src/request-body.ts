/**
 * A request body once encoded: sent as-is on every attempt.
 *
 * @example
 * const { body, contentType } = encodeBody({ amount: 500 });
 */
export interface EncodedBody {
  body: RequestInit['body'] | undefined;
  /**
   * Set when the client chose the encoding: JSON, text for a string, a serialised `URLSearchParams`,
   * or FormData's multipart with its boundary.
   */
  contentType: string | undefined;
}

const isInstance = (
  value: unknown,
  name: 'Blob' | 'FormData' | 'URLSearchParams' | 'ReadableStream' | 'Response' | 'Request',
): boolean => {
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

// Values JSON.stringify turns into `{}` whatever they hold: a Promise (a missing `await`),
// collections and iterators, whose values live where it does not look, an Error, a Response and a
// Request. Sent, `{}` is a valid body
// that a lenient server runs the operation on. A `toJSON` says how the value is meant to be sent.
function lostInJson(value: unknown): string | undefined {
  if (typeof value !== 'object' || value === null || Array.isArray(value) || value instanceof String) return undefined;
  if (typeof (value as { toJSON?: unknown }).toJSON === 'function') return undefined;
  if (typeof (value as { then?: unknown }).then === 'function') {
    return 'the body is a Promise: await it first, then pass its value';
  }
  // An Error's message and stack are not enumerable: a caught error passed on as the body went as
  // `{}` (or with only the extra fields some libraries add), its point lost. Another realm's Error
  // fails instanceof but still says `[object Error]`.
  if (value instanceof Error || Object.prototype.toString.call(value) === '[object Error]') {
    return 'an Error body would be sent as {} (its message is not enumerable): pass the fields you mean ({ message: error.message }) or give it a toJSON';
  }
  // A fetch Response or Request keeps its body and headers in internal slots: a proxying handler
  // that passed one on sent `{}`.
  if (isInstance(value, 'Response') || isInstance(value, 'Request')) {
    const name = isInstance(value, 'Response') ? 'Response' : 'Request';
    return `a ${name} body would be sent as {}: pass its content instead (await it.bytes(), or await it.json())`;
  }
  // An iterable of another kind counts only when JSON would find nothing in it (a generator, an
  // iterator): one with fields of its own is sent with them, as before.
  const iterable = typeof (value as { [Symbol.iterator]?: unknown })[Symbol.iterator] === 'function';
  if (
    value instanceof Map ||
    value instanceof Set ||
    value instanceof WeakMap ||
    value instanceof WeakSet ||
    (iterable && Object.keys(value).length === 0)
  ) {
    return 'a Map, Set or iterator body would be sent as {}: pass an array or a plain object (Object.fromEntries, [...values])';
  }
  return undefined;
}

// An ArrayBuffer made in another realm (a vm context, a jsdom test environment, an iframe) fails
// `instanceof ArrayBuffer`, and JSON.stringify would send `{}` for it. fetch sends its bytes, and so
// does this: such a buffer still says `[object ArrayBuffer]`.
function isArrayBuffer(value: unknown): value is ArrayBuffer {
  return value instanceof ArrayBuffer || Object.prototype.toString.call(value) === '[object ArrayBuffer]';
}

// A copy of the bytes a view covers, so a buffer the caller reuses or changes afterwards (a pooled
// buffer, a reused Uint8Array) cannot change what this call's attempts send.
function copyBytes(value: ArrayBuffer | ArrayBufferView): Uint8Array<ArrayBuffer> {
  if (isArrayBuffer(value)) return new Uint8Array(value).slice();
  return new Uint8Array(value.buffer, value.byteOffset, value.byteLength).slice();
}

// What the multipart/form-data encoding (HTML standard) does to a name and a filename, and to the
// line breaks of a name and of a string value, as fetch (undici, browsers) writes them.
const escapeName = (text: string) => text.replace(/\n/g, '%0A').replace(/\r/g, '%0D').replace(/"/g, '%22');
const crlf = (text: string) => text.replace(/\r?\n|\r/g, '\r\n');

/**
 * A form as one multipart body, with one boundary for every attempt (fetch would draw a new one per
 * attempt, and a server that hashes the bytes would see another request). A Blob of the parts, not
 * their bytes: a file in the form (a Blob on disk from `fs.openAsBlob`, a File from a file input) is
 * read when an attempt sends it, not held in memory whole for the life of the call. Its entries are
 * strings and Files, both immutable, and are taken here, synchronously, as fetch takes them.
 */
function encodeMultipart(form: FormData): EncodedBody {
  const random = globalThis.crypto.getRandomValues(new Uint8Array(16));
  const boundary = `----formdata-idem-${Array.from(random, (b) => b.toString(16).padStart(2, '0')).join('')}`;
  const parts: BlobPart[] = [];
  form.forEach((entry, name) => {
    const head = `--${boundary}\r\nContent-Disposition: form-data; name="${escapeName(crlf(name))}"`;
    if (typeof entry === 'string') {
      parts.push(`${head}\r\n\r\n${crlf(entry)}\r\n`);
      return;
    }
    const filename = entry.name ? `; filename="${escapeName(entry.name)}"` : '';
    parts.push(
      `${head}${filename}\r\nContent-Type: ${entry.type || 'application/octet-stream'}\r\n\r\n`,
      entry,
      '\r\n',
    );
  });
  parts.push(`--${boundary}--\r\n`);
  return { body: new Blob(parts), contentType: `multipart/form-data; boundary=${boundary}` };
}

/**
 * Encodes a request body once, so every attempt sends the very same bytes (a server comparing
 * fingerprints then sees one request, not several). `undefined` sends no body; anything else that
 * is not listed here is JSON. A stream (web or Node) or an async iterable is refused with a
 * `TypeError`: it can be read only once, so it cannot be retried. So is a value JSON would send as
 * `{}` whatever it holds: a Promise (a missing `await`), a Map, a Set, an iterator, an Error, a
 * Response or a Request.
 *
 * Everything the body depends on is read synchronously, in this call, as `fetch` itself does: the
 * retries run after awaits (a backoff, a token refresh), and by then the caller may have refilled a
 * buffer or reused one `URLSearchParams` for the next call. So bytes (`ArrayBuffer`, typed arrays,
 * `DataView`) are copied, `URLSearchParams` is serialised, and `FormData` is encoded here, once, as
 * a Blob of its parts (fetch would draw a new boundary per attempt), whose files are read only as
 * each attempt sends them. Strings and `Blob`s are immutable and go as they are.
 *
 * @example
 * encodeBody({ amount: 500 }); // { body: '{"amount":500}', contentType: 'application/json' }
 */
export function encodeBody(value: unknown): EncodedBody {
  if (value === undefined) return { body: undefined, contentType: undefined };
  if (isOneShot(value)) {
    throw new TypeError('a stream body can be read only once and so cannot be retried: pass a string, bytes or a Blob');
  }
  // The type the Fetch standard gives a string body, set here because Bun's fetch sets none: the
  // same call must be the same request (type included) whichever runtime sends it.
  if (typeof value === 'string') return { body: value, contentType: 'text/plain;charset=UTF-8' };
  // A Blob goes with its own type, or none: what every fetch sends for it.
  if (isInstance(value, 'Blob')) return { body: value as Blob, contentType: undefined };
  if (isArrayBuffer(value) || ArrayBuffer.isView(value)) return { body: copyBytes(value), contentType: undefined };
  if (isInstance(value, 'URLSearchParams')) {
    // The type fetch would give it; set here because the body is now a plain string.
    return { body: String(value), contentType: 'application/x-www-form-urlencoded;charset=UTF-8' };
  }
  if (isInstance(value, 'FormData')) return encodeMultipart(value as FormData);
  const lost = lostInJson(value);
  if (lost !== undefined) throw new TypeError(lost);
  const json = JSON.stringify(value);
  if (json === undefined) throw new TypeError('the body cannot be encoded as JSON');
  return { body: json, contentType: 'application/json' };
}
