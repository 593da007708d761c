import { createHash, hash } from 'node:crypto';
import { canonicalJson, integerText, isRawJson, rawJson } from './canonical-json.js';
import { parameterOf, parameterPattern } from './media-type.js';
import { canonicalMultipart } from './multipart.js';
import { isPlainObject } from './plain-object.js';
import { normalisePercentEncoding } from './route-path.js';

/** The parts of a request that make up its identity. */
export interface RequestParts {
  method: string;
  /** The route template, e.g. `/charges/:id`. */
  route?: string | undefined;
  /** The concrete path, e.g. `/charges/ch_1`. */
  path?: string | undefined;
  /** The query string (with or without `?`), or already-parsed pairs. */
  query?: string | URLSearchParams | Record<string, string | readonly string[] | undefined> | undefined;
  contentType?: string | undefined;
  body?: Uint8Array | string | undefined;
  /**
   * The body as a parser already left it, for when the raw bytes are gone (a body parser ran first);
   * used only when `body` is absent. With a JSON media type it is canonicalised as it is, which gives
   * the fingerprint its raw bytes would give, without serialising and parsing it again; otherwise
   * the bytes of its JSON serialisation are hashed.
   */
  json?: unknown;
  /** Extra request headers that are part of the identity (e.g. an API version), name to value. */
  headers?: Record<string, string | undefined> | undefined;
}

/** Options of {@link fingerprintRequest}. */
export interface FingerprintOptions {
  /**
   * JSON Pointers (RFC 6901) of body fields to leave out, for volatile fields such as a client
   * timestamp or nonce: `['/sentAt', '/meta/nonce']`. Only applies to JSON bodies. A `*` token where
   * the body has an array stands for each of its items: the pointer of the tokens `items`, `*` and
   * `clientRef` leaves out the `clientRef` of every item (an array index is digits only, so no
   * pointer meant otherwise; on an object, `*` is the member named `*`, as RFC 6901 has it).
   */
  exclude?: readonly string[] | undefined;
}

/**
 * Checks the `exclude` of {@link FingerprintOptions} once, when a middleware is made: each entry a
 * JSON Pointer (RFC 6901: empty, or `/` then tokens where `~` only starts `~0` or `~1`). A pointer
 * that is not one (`'sentAt'` without its slash) would exclude nothing, and every retry that changed
 * the field would be refused 422 for no reason the developer could see. Throws a `TypeError`.
 *
 * @example
 * checkExcludes(['/sentAt', '/meta/nonce']); // fine
 * checkExcludes(['sentAt']); // TypeError
 */
export function checkExcludes(exclude: unknown, name = 'fingerprint.exclude'): readonly string[] | undefined {
  if (exclude === undefined) return undefined;
  if (!Array.isArray(exclude)) throw new TypeError(`${name} must be an array of JSON Pointers`);
  for (const pointer of exclude) {
    if (typeof pointer !== 'string' || !jsonPointer.test(pointer)) {
      throw new TypeError(
        `${name} holds ${JSON.stringify(pointer)}, which is no JSON Pointer (RFC 6901): write '/field/sub', '~1' for '/' and '~0' for '~'`,
      );
    }
  }
  return exclude as readonly string[];
}

const jsonPointer = /^(\/([^~/]|~[01])*)*$/;

const textDecoder = new TextDecoder('utf-8', { fatal: true });

/**
 * SHA-256 fingerprint (hex) of a request: method, route template, concrete path, normalised query,
 * media type and body. JSON bodies are canonicalised (RFC 8785) so key order and whitespace do not
 * matter; a multipart body hashes its parts without the boundary, which clients choose anew on each
 * try; other bodies (form, binary, invalid JSON) hash their exact bytes. Each part is
 * length-prefixed so no two different requests can be framed into the same input.
 *
 * @example
 * const fp = fingerprintRequest({ method: 'POST', route: '/charges', path: '/charges',
 *   contentType: 'application/json', body: '{"amount":100}' });
 */
export function fingerprintRequest(parts: RequestParts, options: FingerprintOptions = {}): string {
  // The hashed input is `<label><byte length>:<value>` for each part in turn: built as one string and
  // hashed in one call, which is the same bytes as a hash update per prefix and per part (and so the
  // same fingerprint as records stored before), at a third of the cost.
  const contentType = parts.contentType ?? '';
  const query = parts.query;
  let framed: string;
  let mediaType: string;
  // Requests come in runs of one route: the framed parts before the body are kept from the last
  // call and reused when method, route, path, query string and content type are the same strings.
  if (
    last !== undefined &&
    parts.headers === undefined &&
    (query === undefined || typeof query === 'string') &&
    parts.method === last.method &&
    parts.route === last.route &&
    parts.path === last.path &&
    query === last.query &&
    contentType === last.contentType
  ) {
    framed = last.framed;
    mediaType = last.mediaType;
  } else {
    mediaType = mediaTypeOf(contentType);
    framed =
      frame('m', parts.method.toUpperCase()) +
      frame('r', parts.route ?? '') +
      frame('p', normalisePercentEncoding(withoutFragment(parts.path ?? ''))) +
      frame('q', normaliseQuery(query)) +
      frame('t', mediaType);
    const charset = contentType.includes(';') ? framedCharsetOf(contentType) : undefined;
    if (charset !== undefined) framed += frame('c', charset);
    if (parts.headers) {
      for (const name of Object.keys(parts.headers).sort())
        framed += frame('h', `${name.toLowerCase()}=${parts.headers[name] ?? ''}`);
    } else if (query === undefined || typeof query === 'string') {
      last = { method: parts.method, route: parts.route, path: parts.path, query, contentType, framed, mediaType };
    }
  }
  let label = 'b';
  let body: Uint8Array | string;
  if (parts.body === undefined && parts.json !== undefined) {
    body = bodyForHashFromValue(parts.json, mediaType, options.exclude);
  } else if (mediaType.startsWith('multipart/') && parts.body !== undefined) {
    // A form by its parts, not its boundary (see canonicalMultipart), under a label of its own: no
    // raw body, however it is made, frames into the same input. One not well-formed: its bytes.
    const form = canonicalMultipart(typeof parts.body === 'string' ? Buffer.from(parts.body) : parts.body, contentType);
    if (form !== undefined) label = 'f';
    body = form ?? parts.body;
  } else {
    body = bodyForHash(parts.body, mediaType, options.exclude);
  }
  if (typeof body === 'string') return hash('sha256', framed + frame(label, body), 'hex');
  // Raw bytes are not text: they are hashed as they are, after the framed prefix.
  return createHash('sha256').update(`${framed}${label}${body.length}:`).update(body).digest('hex');
}

/**
 * SHA-256 fingerprint (hex) of a message's payload: its bytes as they are, a string as its UTF-8.
 * What `makeIdempotent` compares across deliveries of a message, which has no method, route
 * or media type to frame, so nothing but the payload goes into the hash (the same digest as
 * `createHash('sha256').update(payload).digest('hex')`, which the queues guide's copied wrapper
 * stored). A string must be well formed: a lone surrogate has no UTF-8 form, and hashed as U+FFFD
 * two different strings would fingerprint alike; the caller refuses one first.
 *
 * @example
 * payloadFingerprint('{"id":"order-1"}') === payloadFingerprint(Buffer.from('{"id":"order-1"}')); // true
 */
export function payloadFingerprint(payload: string | Uint8Array): string {
  return hash('sha256', payload, 'hex');
}

let last:
  | {
      method: string;
      route: string | undefined;
      path: string | undefined;
      query: string | undefined;
      contentType: string;
      framed: string;
      mediaType: string;
    }
  | undefined;

function frame(label: string, value: string): string {
  return `${label}${Buffer.byteLength(value, 'utf8')}:${value}`;
}

/**
 * Compares two fingerprints in constant time. Empty strings mean "not fingerprinted" and match anything,
 * so a record made without a fingerprint never causes a mismatch.
 */
export function fingerprintsMatch(a: string, b: string): boolean {
  if (a === '' || b === '') return true;
  // Lengths are public (a fingerprint is 64 hex characters); the content is compared without an
  // early exit, code unit by code unit, which is timingSafeEqual's guarantee without encoding both
  // strings into buffers first (every replay comes through here).
  if (a.length !== b.length) return false;
  let difference = 0;
  for (let i = 0; i < a.length; i++) difference |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return difference === 0;
}

// A fragment is no part of what a server is asked (RFC 9110 §7.1); a client should never send one, and
// where one is sent the frameworks disagree on whether it belongs to the path or the query. Cut, the
// same request fingerprints alike behind any of them.
function withoutFragment(text: string): string {
  const hash = text.indexOf('#');
  return hash === -1 ? text : text.slice(0, hash);
}

function normaliseQuery(query: RequestParts['query']): string {
  if (query === undefined || query === '' || query === '?') return '';
  let params: URLSearchParams;
  if (typeof query === 'string') {
    const text = withoutFragment(query);
    const raw = text.startsWith('?') ? text.slice(1) : text;
    if (highEscape.test(raw)) {
      const exact = queryWithRawBytes(raw);
      if (exact !== undefined) return exact;
    }
    params = new URLSearchParams(raw);
  } else if (query instanceof URLSearchParams) params = new URLSearchParams(query);
  else {
    params = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) {
      if (value === undefined) continue;
      for (const item of typeof value === 'string' ? [value] : value) params.append(name, item);
    }
  }
  // Sorting by name makes `?b=2&a=1` and `?a=1&b=2` one request. The sort is stable, so the values
  // of a repeated name keep the order they were sent in: `?ids=1&ids=2` reaches a handler as
  // ['1', '2'] and `?ids=2&ids=1` as ['2', '1'], two requests. Every value is kept, so `?a=1&a=2`
  // never equals `?a=1`.
  const pairs = [...params].sort(byName);
  return pairs.map(([n, v]) => `${encodeURIComponent(n)}=${encodeURIComponent(v)}`).join('&');
}

// An escape of a byte past ASCII: only such a query can hold an escape that is not UTF-8.
const highEscape = /%[89a-f][0-9a-f]/i;

// UTF-8 as URLSearchParams decodes it: a leading byte order mark is kept, not dropped.
const formDecoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * The normalised query of a query string where an escape spells bytes that are not UTF-8 (`%FF`), or
 * undefined when there is none (the caller then normalises it as always). URLSearchParams decodes
 * each such escape to U+FFFD, so `?id=%FF` and `?id=%FE` were one request; the frameworks hand the
 * handler `'%FF'` and `'%FE'` (qs, fast-querystring), two. A name or value that is not UTF-8 keeps
 * its bytes here, each escape spelled in upper case: no UTF-8 text is ever written that way, so it
 * cannot frame as any other. Every other name and value is written as the usual path writes it.
 */
function queryWithRawBytes(raw: string): string | undefined {
  const pairs: Array<[string, string]> = [];
  let rawBytes = false;
  for (const piece of raw.split('&')) {
    if (piece === '') continue;
    const equals = piece.indexOf('=');
    const name = formComponent(equals === -1 ? piece : piece.slice(0, equals));
    const value = formComponent(equals === -1 ? '' : piece.slice(equals + 1));
    if (name.text === undefined || value.text === undefined) rawBytes = true;
    pairs.push([name.text ?? name.encoded, `${name.encoded}=${value.encoded}`]);
  }
  if (!rawBytes) return undefined;
  return pairs
    .sort(byName)
    .map(([, pair]) => pair)
    .join('&');
}

/** A name or value of a form-encoded query: its text when its bytes are UTF-8, and its encoded form. */
function formComponent(component: string): { text: string | undefined; encoded: string } {
  const bytes = percentDecoded(Buffer.from(component.replaceAll('+', ' ')));
  let text: string;
  try {
    text = formDecoder.decode(bytes);
  } catch {
    let encoded = '';
    for (const byte of bytes) {
      encoded += uriUnreserved.test(String.fromCharCode(byte))
        ? String.fromCharCode(byte)
        : `%${byte.toString(16).toUpperCase().padStart(2, '0')}`;
    }
    return { text: undefined, encoded };
  }
  return { text, encoded: encodeURIComponent(text) };
}

// What encodeURIComponent leaves as it is.
const uriUnreserved = /^[A-Za-z0-9\-_.!~*'()]$/;

// WHATWG URL's percent-decode: `%` and two hex digits is that byte; anything else stays as it is.
function percentDecoded(bytes: Buffer): Buffer {
  const out = Buffer.allocUnsafe(bytes.length);
  let length = 0;
  for (let i = 0; i < bytes.length; i++) {
    const byte = bytes[i] as number;
    if (byte === 0x25 && i + 2 < bytes.length && isHexDigit(bytes[i + 1]) && isHexDigit(bytes[i + 2])) {
      out[length++] = Number.parseInt(bytes.toString('latin1', i + 1, i + 3), 16);
      i += 2;
    } else out[length++] = byte;
  }
  return out.subarray(0, length);
}

function isHexDigit(byte: number | undefined): boolean {
  return (
    byte !== undefined &&
    ((byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x46) || (byte >= 0x61 && byte <= 0x66))
  );
}

// Names in code unit order; equal names compare equal, so the stable sort keeps their values in order.
function byName([a]: readonly [string, string], [b]: readonly [string, string]): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function isJsonMediaType(mediaType: string): boolean {
  return mediaType === 'application/json' || mediaType.endsWith('+json');
}

/**
 * True when a `Content-Type` names JSON (`application/json` or any `+json` type, parameters ignored):
 * the bodies whose fingerprint is their canonical form rather than their bytes.
 *
 * @example
 * isJsonContentType('application/merge-patch+json; charset=utf-8'); // true
 */
export function isJsonContentType(contentType: string | undefined): boolean {
  return contentType !== undefined && isJsonMediaType(mediaTypeOf(contentType));
}

/**
 * The `charset` parameter of a content type, lower case and unquoted, when it says anything but
 * UTF-8 (or the parameter is absent: undefined). The body parsers decode a text body by it, so the
 * same bytes under `charset=shift_jis` and under UTF-8 are two texts, two requests: the charset is
 * framed into the fingerprint then. Not when it names UTF-8 (or is absent), which is how nearly
 * every request is sent: their fingerprints are those of records stored before it was framed.
 */
function framedCharsetOf(contentType: string): string | undefined {
  const charset = parameterOf(charsetParameter, contentType)?.toLowerCase();
  return charset === 'utf-8' || charset === 'utf8' ? undefined : charset;
}

const charsetParameter = parameterPattern('charset');

// `Application/JSON; charset=utf-8` -> `application/json`: the type and subtype, parameters dropped.
function mediaTypeOf(contentType: string): string {
  return contentType.split(';')[0]!.trim().toLowerCase();
}

function bodyForHash(
  body: Uint8Array | string | undefined,
  mediaType: string,
  exclude?: readonly string[],
): Uint8Array | string {
  if (body === undefined) return '';
  if (!isJsonMediaType(mediaType)) return body;
  let text: string;
  try {
    text = typeof body === 'string' ? body : textDecoder.decode(body);
  } catch {
    return body; // invalid UTF-8: not JSON, hash the bytes as they are
  }
  let value: unknown;
  try {
    // Integers past 2^53 are kept exact (a run of 16 digits is the cheap sign of one): parsed as
    // doubles, two different amounts could fingerprint alike and the second would get a replay.
    value = longDigits.test(text) ? JSON.parse(text, exactIntegers) : JSON.parse(text);
  } catch {
    return body;
  }
  if (exclude && exclude.length > 0) removePointers(value, exclude);
  // `json:` marks canonical text so it can never equal a raw body that happens to hold the same bytes.
  const canonical = canonicalJson(value);
  return canonical === undefined ? body : `json:${canonical}`;
}

const longDigits = /\d{16}/;

// A JSON.parse reviver: a number that is an integer past 2^53 is kept as its source text (raw JSON,
// written back as those digits). Not a bigint: BigInt of a million digits and back costs a second.
function exactIntegers(_key: string, value: unknown, context?: { source?: string }): unknown {
  if (typeof value !== 'number' || Number.isSafeInteger(value)) return value;
  const source = context?.source;
  return source !== undefined && integerText.test(source) ? rawJson(source) : value;
}

function bodyForHashFromValue(value: unknown, mediaType: string, exclude?: readonly string[]): Uint8Array | string {
  if (isJsonMediaType(mediaType) && !(exclude && exclude.length > 0)) {
    const canonical = canonicalJson(value);
    if (canonical !== undefined) return `json:${canonical}`;
  }
  // Another media type, exclusions, or a value that is not plain JSON data (a reviver made dates or
  // class instances) or is too deep: hash what it serialises to, exactly as the bytes of that body.
  return bodyForHash(Buffer.from(serialised(value)), mediaType, exclude);
}

/**
 * The JSON text of a body a parser already parsed, for when its bytes are gone: the canonical form
 * (RFC 8785) when it has one, else what `JSON.stringify` writes. Either fingerprints, as bytes of a
 * JSON body, exactly as the parsed value itself does. Nesting too deep for the stack (which a JSON
 * parser accepts) is written without recursion, never a stack overflow.
 *
 * @example
 * jsonBodyText({ b: 1, a: 2 }); // '{"a":2,"b":1}'
 */
export function jsonBodyText(value: unknown): string {
  return canonicalJson(value) ?? serialised(value);
}

function serialised(value: unknown): string {
  try {
    return JSON.stringify(value, bigIntsAsNumbers) ?? '';
  } catch (error) {
    // Plain data nested deeper than JSON.stringify can recurse; anything else fails as it did.
    const text = error instanceof RangeError ? compactJson(value) : undefined;
    if (text === undefined) throw error;
    return text;
  }
}

// A parser that keeps big integers exact (a reviver, json-bigint) leaves bigints, which
// JSON.stringify refuses: each is written as the number it was read from, so the body fingerprints
// as its bytes do instead of failing the request. A number too large for a double (`1e400`, read as
// Infinity) is written as such a number, not as the `null` JSON.stringify writes, which is another
// request.
function bigIntsAsNumbers(_key: string, value: unknown): unknown {
  if (typeof value === 'bigint') return rawJson(value.toString());
  return typeof value === 'number' && !Number.isFinite(value) ? rawJson(nonFiniteText(value)) : value;
}

// The JSON text of a number no double holds: a magnitude past the largest one, with its sign. (NaN
// is no JSON number a parser gives; a reviver's NaN is written as `null`, as JSON.stringify does.)
function nonFiniteText(value: number): string {
  if (Number.isNaN(value)) return 'null';
  return value > 0 ? '1e400' : '-1e400';
}

interface Level {
  readonly items: readonly unknown[] | Record<string, unknown>;
  /** The member names of an object; undefined for an array. */
  readonly names: string[] | undefined;
  next: number;
}

/**
 * Plain JSON data (arrays, plain objects, strings, numbers, bigints, booleans, null) written as
 * `JSON.stringify` writes it (bigints as numbers, as above), with an explicit stack instead of
 * recursion. Undefined for anything else, which the caller reports as `JSON.stringify` did.
 */
function compactJson(root: unknown): string | undefined {
  const levels: Level[] = [];
  let out = '';
  let value = root;
  for (;;) {
    if (value === null) out += 'null';
    else if (typeof value === 'string') out += JSON.stringify(value);
    else if (typeof value === 'number') out += Number.isFinite(value) ? String(value) : nonFiniteText(value);
    else if (typeof value === 'boolean') out += value ? 'true' : 'false';
    else if (typeof value === 'bigint') out += value.toString();
    else if (isRawJson(value)) out += value.rawJSON;
    else if (Array.isArray(value)) {
      out += '[';
      levels.push({ items: value, names: undefined, next: 0 });
    } else if (isPlainObject(value)) {
      out += '{';
      levels.push({ items: value as Record<string, unknown>, names: Object.keys(value), next: 0 });
    } else return undefined;
    // On to the next value: the first item of a container just opened, or the one after the value
    // just written, closing every container that has no more.
    for (;;) {
      const level = levels[levels.length - 1];
      if (level === undefined) return out;
      const { items, names } = level;
      if (names === undefined) {
        const array = items as readonly unknown[];
        if (level.next < array.length) {
          if (level.next > 0) out += ',';
          value = array[level.next++];
          break;
        }
        out += ']';
      } else {
        if (level.next < names.length) {
          const name = names[level.next] as string;
          out += `${level.next > 0 ? ',' : ''}${JSON.stringify(name)}:`;
          level.next++;
          value = (items as Record<string, unknown>)[name];
          break;
        }
        out += '}';
      }
      levels.pop();
    }
  }
}

// Removes in place: `value` is always one just parsed from the body, nobody else's. (A copy made
// with structuredClone recursed, and a body nested deeper than the stack crashed the request.)
function removePointers(value: unknown, pointers: readonly string[]): void {
  for (const pointer of pointers) {
    if (!pointer.startsWith('/')) continue;
    const path = pointer
      .slice(1)
      .split('/')
      .map((token) => token.replaceAll('~1', '/').replaceAll('~0', '~'));
    remove(value, path, 0);
  }
}

// RFC 6901's array index: no sign, no leading zero (`length` or `01` names no item).
const arrayIndex = /^(0|[1-9]\d*)$/;

// Removes what `path` (from token `at` on) points to below `node`, where it exists. Recursion is
// bounded by the pointer's length, which the developer wrote, not by the body.
function remove(node: unknown, path: readonly string[], at: number): void {
  if (node === null || typeof node !== 'object') return;
  const token = path[at] as string;
  const last = at === path.length - 1;
  if (Array.isArray(node)) {
    if (token === '*') {
      if (last) node.length = 0;
      else for (const item of node) remove(item, path, at + 1);
      return;
    }
    if (!arrayIndex.test(token) || Number(token) >= node.length) return;
    if (last) node.splice(Number(token), 1);
    else remove(node[Number(token)], path, at + 1);
    return;
  }
  if (!Object.hasOwn(node, token)) return;
  if (last) delete (node as Record<string, unknown>)[token];
  else remove((node as Record<string, unknown>)[token], path, at + 1);
}
