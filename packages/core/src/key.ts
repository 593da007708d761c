import { trimBlanks } from './blanks.js';
import { IdempotencyError } from './errors.js';

/** Options of {@link parseIdempotencyKey}. */
export interface ParseKeyOptions {
  /**
   * With `strict: true` only an RFC 9651 sf-string (`"abc"`) is accepted, as draft-07 requires.
   * By default a bare value (`abc`) is accepted too, and both spellings are the same key.
   */
  strict?: boolean | undefined;
  /** Maximum length in UTF-8 bytes of the decoded key. Default 255. */
  maxBytes?: number | undefined;
}

/** The result of {@link parseIdempotencyKey}: a key, or the typed error an adapter answers with 400. */
export type ParsedKey = { ok: true; key: string } | { ok: false; error: IdempotencyError };

const invalid = (detail: string): ParsedKey => ({ ok: false, error: new IdempotencyError('key_invalid', detail) });

/**
 * Parses the `Idempotency-Key` field value(s) of a request.
 *
 * Accepts one field line holding one RFC 9651 Item that is an sf-string (`"8e03-..."`), with any
 * parameters ignored, or, unless `strict`, a bare value of visible ASCII without `"`, `,`, `;` or `\`.
 * The decoded key must be 1 to `maxBytes` bytes of printable ASCII and not only spaces.
 * Two field lines, a list, control characters, non-ASCII bytes or an over-long key are refused.
 *
 * @example
 * parseIdempotencyKey('"abc"');   // { ok: true, key: 'abc' }
 * parseIdempotencyKey('abc');     // { ok: true, key: 'abc' } (lenient default)
 * parseIdempotencyKey(['a', 'b']); // { ok: false, error: IdempotencyError('key_invalid') }
 */
export function parseIdempotencyKey(
  fieldValues: string | readonly string[] | undefined,
  options: ParseKeyOptions = {},
): ParsedKey {
  const maxBytes = options.maxBytes ?? 255;
  if (fieldValues === undefined || (Array.isArray(fieldValues) && fieldValues.length === 0)) {
    return {
      ok: false,
      error: new IdempotencyError('key_missing', 'This operation requires an Idempotency-Key header.'),
    };
  }
  if (Array.isArray(fieldValues) && fieldValues.length > 1) {
    return invalid('The Idempotency-Key header must appear once.');
  }
  const raw = (typeof fieldValues === 'string' ? fieldValues : fieldValues[0]) as string;
  // Optional whitespace around a field value is not part of it (RFC 9110 5.5).
  const value = trimBlanks(raw);
  if (value.length === 0) return invalid('The Idempotency-Key header is empty.');

  let key: string;
  if (value.charCodeAt(0) === 0x22) {
    const parsed = parseSfString(value);
    if (parsed === undefined) return invalid('The Idempotency-Key header is not a valid structured-field string.');
    key = parsed;
  } else {
    if (options.strict) return invalid('The Idempotency-Key header must be a quoted structured-field string.');
    for (let i = 0; i < value.length; i++) {
      const c = value.charCodeAt(i);
      // Visible ASCII only; the four excluded characters would make the value a list, carry
      // parameters, or be half of a quoted string, so they are refused rather than guessed at.
      if (c < 0x21 || c > 0x7e || c === 0x22 || c === 0x2c || c === 0x3b || c === 0x5c) {
        return invalid('The Idempotency-Key header contains a character that is not allowed.');
      }
    }
    key = value;
  }
  if (key.length === 0) return invalid('The Idempotency-Key header is empty.');
  if (key.trim().length === 0) return invalid('The Idempotency-Key header is only whitespace.');
  // Every accepted character is ASCII, so characters and UTF-8 bytes count the same.
  if (key.length > maxBytes) return invalid(`The Idempotency-Key must be at most ${maxBytes} bytes.`);
  return { ok: true, key };
}

/** Parses `"..."` followed by optional `;param` items (RFC 9651 3.3.3 and 3.1.2); undefined if malformed. */
function parseSfString(input: string): string | undefined {
  let out = '';
  let i = 1;
  for (;;) {
    if (i >= input.length) return undefined; // no closing quote
    const c = input.charCodeAt(i);
    if (c === 0x5c) {
      const next = input.charCodeAt(i + 1);
      if (next !== 0x22 && next !== 0x5c) return undefined;
      out += input[i + 1];
      i += 2;
      continue;
    }
    if (c === 0x22) {
      i++;
      break;
    }
    if (c < 0x20 || c > 0x7e) return undefined;
    out += input[i];
    i++;
  }
  const rest = input.slice(i);
  // Trailing garbage, a second list member, or a malformed parameter.
  if (rest.length > 0 && !wellFormedParameters(rest)) return undefined;
  return out;
}

// RFC 9651 3.1.2 and 3.3: `;` and a key, then optionally `=` and a bare item of any type: an
// integer (15 digits at most), a decimal (12 before the point, 3 after), a string, a token, a byte
// sequence, a boolean, a date or a display string. The key ignores its parameters, but a field
// that is no Item is refused (draft-07: a malformed field is 400), whatever type a client used.
const sfString = /"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"/.source;
const sfToken = /[A-Za-z*][!#$%&'*+\-.^_`|~:/0-9A-Za-z]*/.source;
const sfNumber = /-?(?:\d{1,12}\.\d{1,3}|\d{1,15})/.source;
// Base64 that decodes (RFC 9651 4.2.7: parsing fails when it does not): whole groups of four, the
// last one padded or not, but never a lone character or padding that does not fit.
const sfBinary = /:(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}(?:==)?|[A-Za-z0-9+/]{3}=?)?:/.source;
const sfDate = /@-?\d{1,15}/.source;
const sfDisplay = /%"(?:[\x20\x21\x23\x24\x26-\x7e]|%[0-9a-f]{2})*"/.source;
// One parameter, matched where the last one ended (sticky); the display string, if any, captured.
const sfParameter = new RegExp(
  `;[ ]*[a-z*][a-z0-9_.*-]*(?:=(?:${sfString}|${sfToken}|${sfNumber}|${sfBinary}|\\?[01]|${sfDate}|(${sfDisplay})))?`,
  'y',
);

function wellFormedParameters(rest: string): boolean {
  sfParameter.lastIndex = 0;
  while (sfParameter.lastIndex < rest.length) {
    const match = sfParameter.exec(rest);
    if (match === null) return false;
    // A display string's escapes must spell UTF-8 (RFC 9651 4.2.10); decodeURIComponent throws otherwise.
    if (match[1] !== undefined && !decodesAsUtf8(match[1].slice(2, -1))) return false;
  }
  return true;
}

function decodesAsUtf8(escaped: string): boolean {
  try {
    decodeURIComponent(escaped);
    return true;
  } catch {
    return false;
  }
}
