import { isPlainObject } from './plain-object.js';

/**
 * RFC 8785 (JSON Canonicalization Scheme) serialisation of a parsed JSON value: object members
 * sorted by their UTF-16 code units, no whitespace, numbers and strings as ECMAScript's
 * `JSON.stringify` writes them (which is what RFC 8785 specifies).
 *
 * A bigint or a `JSON.rawJSON` integer (what a parser that keeps big integers exact leaves) is
 * written as its digits: RFC 8785 would round it to a double, and two different amounts past 2^53
 * must not read as one.
 *
 * Returns `undefined` for values deeper than `maxDepth`, so hostile nesting cannot exhaust the stack,
 * and for anything that is not plain JSON data (a `Date`, a class instance, `undefined`, a function),
 * which a parser with a reviver may leave behind (a plain object of another realm, a vm context's, is
 * data: see {@link isPlainObject}), or a number that is not finite (`1e400` parses to
 * Infinity): such a value has no canonical form (RFC 8785 has none for them; written as `null`, as
 * `JSON.stringify` does, `{"amount":1e400}` would be one request with `{"amount":null}`), and the
 * caller then hashes bytes instead.
 *
 * @example
 * canonicalJson(JSON.parse('{"b":1,"a":[true,{"d":null,"c":"x"}]}')); // '{"a":[true,{"c":"x","d":null}],"b":1}'
 */
export function canonicalJson(value: unknown, maxDepth = 512): string | undefined {
  try {
    return write(value, maxDepth);
  } catch (error) {
    if (error === tooDeep || error === notJson) return undefined;
    throw error;
  }
}

const tooDeep = Symbol('too deep');
const notJson = Symbol('not JSON data');

// `JSON.rawJSON` and `JSON.isRawJSON` (Node 22 and later; not yet in TypeScript's ES2023 library).
const json = JSON as unknown as { rawJSON(text: string): unknown; isRawJSON(value: unknown): boolean };

/** `JSON.rawJSON(text)`: a value `JSON.stringify` writes as `text`, which must be a JSON primitive. */
export const rawJson = (text: string): unknown => json.rawJSON(text);

/** True for a value made by {@link rawJson}. */
export const isRawJson = (value: unknown): value is { readonly rawJSON: string } => json.isRawJSON(value);

/** The text of an integer as JSON writes it: digits, with a minus in front for a negative one. */
export const integerText = /^-?\d+$/;

// A raw JSON integer (what a reviver that keeps big integers exact leaves) is written as its digits,
// as a bigint is, without a trip through BigInt, which is super-linear in the digit count. Any other
// raw text is written as the value it stands for.
function rawText(text: string, depth: number): string {
  return integerText.test(text) ? text : write(JSON.parse(text), depth);
}

// Every request body with a key goes through here, so the common cases skip the general calls:
// a string of printable ASCII without `"` or `\` needs no escaping, a finite number's `String` is
// exactly its JSON form, and a short member list is sorted in place without a sort call.
// Checked a character at a time rather than by a regular expression: the strings of a body are short
// (keys, codes, amounts as text), where the loop costs about two thirds of the regex test.
function isPlainString(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x20 || c === 0x22 || c === 0x5c || c > 0x7e) return false;
  }
  return true;
}

function writeString(text: string): string {
  return isPlainString(text) ? `"${text}"` : JSON.stringify(text);
}

function write(value: unknown, depth: number): string {
  switch (typeof value) {
    case 'string':
      return writeString(value);
    case 'number':
      if (!Number.isFinite(value)) throw notJson;
      return String(value);
    case 'boolean':
      return value ? 'true' : 'false';
    case 'bigint':
      return value.toString();
  }
  if (value === null) return 'null';
  if (typeof value !== 'object') throw notJson;
  if (isRawJson(value)) return rawText(value.rawJSON, depth);
  if (depth <= 0) throw tooDeep;
  if (Array.isArray(value)) {
    let out = '[';
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out += ',';
      out += write(value[i], depth - 1);
    }
    return `${out}]`;
  }
  // An object of another realm too (a vm context's `{}`): plain JSON data whatever made it.
  if (!isPlainObject(value)) throw notJson;
  const object = value;
  const keys = sortCodeUnits(Object.keys(object));
  let out = '{';
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i] as string;
    if (i > 0) out += ',';
    // Appended piece by piece: a template literal per member made one more string per member.
    out += isPlainString(key) ? `"${key}":` : `${JSON.stringify(key)}:`;
    out += write(object[key], depth - 1);
  }
  return `${out}}`;
}

// Sorts by UTF-16 code units, the order RFC 8785 requires (JavaScript's `<` on strings and the
// default sort both compare code units). Insertion sort for the short lists of most bodies.
function sortCodeUnits(keys: string[]): string[] {
  if (keys.length > 16) return keys.sort();
  for (let i = 1; i < keys.length; i++) {
    const key = keys[i] as string;
    let j = i - 1;
    while (j >= 0 && (keys[j] as string) > key) {
      keys[j + 1] = keys[j] as string;
      j--;
    }
    keys[j + 1] = key;
  }
  return keys;
}
