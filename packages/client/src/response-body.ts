/**
 * How a response body is read:
 * - `'auto'` (default): JSON for `application/json` and `+json` types (so problem+json errors
 *   arrive as objects), text for `text/*`, bytes (`Uint8Array`) otherwise, `undefined` when empty.
 * - `'json'`, `'text'`, `'bytes'`: always that.
 * - `'none'`: the body is left unread in `response`, and the per-attempt timeout ends with the headers.
 *
 * Text is decoded in the `charset` the response declares (UTF-8 when it declares none or one no
 * `TextDecoder` knows), unless it starts with a byte order mark, which wins, as in fetch's `text()`;
 * JSON is always UTF-8.
 *
 * @example
 * await client.get('/report.pdf', { parse: 'bytes' });
 */
export type ParseMode = 'auto' | 'json' | 'text' | 'bytes' | 'none';

/**
 * A body that declared JSON but did not parse.
 *
 * @example
 * decodeBody(new TextEncoder().encode('<html>'), 'application/json', 'auto'); // throws BodyParseError
 */
export class BodyParseError extends Error {
  override readonly name = 'BodyParseError' as const;
}

const jsonType = /^application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i;

/**
 * Turns the bytes of a response into the value the caller gets, per {@link ParseMode}.
 * Throws {@link BodyParseError} when the body must be JSON and is not.
 *
 * @example
 * decodeBody(new TextEncoder().encode('{"a":1}'), 'application/json', 'auto'); // { a: 1 }
 */
export function decodeBody(bytes: Uint8Array, contentType: string | null, mode: Exclude<ParseMode, 'none'>): unknown {
  if (mode === 'bytes') return bytes;
  if (mode === 'text') return decodeText(bytes, contentType);
  const type = contentType ?? '';
  if (mode === 'json' || jsonType.test(type)) {
    if (bytes.length === 0) return undefined;
    const text = new TextDecoder().decode(bytes);
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new BodyParseError('the response body is not valid JSON', { cause: error });
    }
  }
  if (bytes.length === 0) return undefined;
  if (/^text\//i.test(type)) return decodeText(bytes, type);
  return bytes;
}

// The `charset` parameter of a Content-Type (RFC 9110 8.3.2), quoted or not.
const charsetParameter = /;\s*charset\s*=\s*(?:"([^"]*)"|([^;\s]*))/i;

// Text in the charset its Content-Type declares: a Shift_JIS or latin1 page read as UTF-8 would come
// out as replacement characters, with nothing to tell the caller. A charset no decoder knows (or
// none) is read as UTF-8, as fetch's `text()` reads everything. JSON is not read here: it is UTF-8
// whatever it declares (RFC 8259 §8.1).
function decodeText(bytes: Uint8Array, contentType: string | null): string {
  // A byte order mark names the encoding before any label does (WHATWG Encoding, "decode"), as
  // fetch's text() and browsers read it; TextDecoder drops it.
  const sniffed = byteOrderMark(bytes);
  if (sniffed !== undefined) return new TextDecoder(sniffed).decode(bytes);
  const match = charsetParameter.exec(contentType ?? '');
  const label = match?.[1] ?? match?.[2];
  if (label) {
    try {
      return new TextDecoder(label).decode(bytes);
    } catch {
      // An unknown label (RangeError): UTF-8 below.
    }
  }
  return new TextDecoder().decode(bytes);
}

function byteOrderMark(bytes: Uint8Array): 'utf-8' | 'utf-16le' | 'utf-16be' | undefined {
  if (bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) return 'utf-8';
  if (bytes[0] === 0xff && bytes[1] === 0xfe) return 'utf-16le';
  if (bytes[0] === 0xfe && bytes[1] === 0xff) return 'utf-16be';
  return undefined;
}
