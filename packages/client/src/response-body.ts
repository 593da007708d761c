/**
 * How a response body is read:
 * - `'auto'` (default): JSON for `application/json` and `+json` types (so problem+json errors
 *   arrive as objects), text for `text/*`, bytes (`Uint8Array`) otherwise, `undefined` when empty.
 * - `'json'`, `'text'`, `'bytes'`: always that.
 * - `'none'`: the body is left unread in `response`, and the per-attempt timeout ends with the headers.
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
  if (mode === 'text') return new TextDecoder().decode(bytes);
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
  if (/^text\//i.test(type)) return new TextDecoder().decode(bytes);
  return bytes;
}
