/**
 * A JSON parser for token headers and payloads that refuses what `JSON.parse` silently accepts:
 * duplicate member names (`JSON.parse` keeps the last, so `{"sub":"a","sub":"admin"}` would name a
 * different subject than a last-wins or first-wins peer sees), a `__proto__` member, and nesting deeper
 * than a small limit (a 10,000-level payload must fail fast, not overflow the stack).
 *
 * Scalars are handed to `JSON.parse` so strings and numbers follow the standard exactly.
 */

/** Why strict parsing failed. */
export type StrictJsonFailure = 'syntax' | 'duplicate-key' | 'proto-key' | 'too-deep';

/** Result of {@link parseStrictJson}. */
export type StrictJsonResult = { ok: true; value: unknown } | { ok: false; reason: StrictJsonFailure };

class StrictJsonError extends Error {
  constructor(readonly reason: StrictJsonFailure) {
    super(reason);
  }
}

const numberPattern = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;

// The parser's position in one document. Module-level functions over this small object, rather than
// closures made per call: the guard parses a header and a payload on every request it verifies.
interface Cursor {
  readonly text: string;
  readonly maxDepth: number;
  position: number;
}

function skipWhitespace(cursor: Cursor): void {
  const { text } = cursor;
  let position = cursor.position;
  while (position < text.length) {
    const c = text.charCodeAt(position);
    if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) position++;
    else break;
  }
  cursor.position = position;
}

function parseString(cursor: Cursor): string {
  // position is at the opening quote; find the closing one, skipping escapes.
  const { text } = cursor;
  const start = cursor.position;
  let end = start + 1;
  // A string without escapes or control characters is exactly its characters: no JSON.parse needed.
  let plain = true;
  while (end < text.length) {
    const c = text.charCodeAt(end);
    if (c === 0x22) break;
    if (c === 0x5c) {
      plain = false;
      end += 2;
    } else {
      if (c < 0x20) plain = false;
      end++;
    }
  }
  if (end >= text.length) throw new StrictJsonError('syntax');
  cursor.position = end + 1;
  if (plain) return text.slice(start + 1, end);
  try {
    return JSON.parse(text.slice(start, end + 1)) as string;
  } catch {
    throw new StrictJsonError('syntax');
  }
}

function parseObject(cursor: Cursor, depth: number): Record<string, unknown> {
  if (depth >= cursor.maxDepth) throw new StrictJsonError('too-deep');
  const { text } = cursor;
  cursor.position++;
  const object: Record<string, unknown> = {};
  skipWhitespace(cursor);
  if (text.charCodeAt(cursor.position) === 0x7d) {
    cursor.position++;
    return object;
  }
  for (;;) {
    skipWhitespace(cursor);
    if (text.charCodeAt(cursor.position) !== 0x22) throw new StrictJsonError('syntax');
    const key = parseString(cursor);
    if (key === '__proto__') throw new StrictJsonError('proto-key');
    // Every name read so far is an own member of `object` (`__proto__`, the one name an assignment
    // would not define, is refused above), so an own member is exactly a repeated name.
    if (Object.hasOwn(object, key)) throw new StrictJsonError('duplicate-key');
    skipWhitespace(cursor);
    if (text.charCodeAt(cursor.position) !== 0x3a) throw new StrictJsonError('syntax');
    cursor.position++;
    object[key] = parseValue(cursor, depth + 1);
    skipWhitespace(cursor);
    const c = text.charCodeAt(cursor.position);
    cursor.position++;
    if (c === 0x2c) continue;
    if (c === 0x7d) return object;
    throw new StrictJsonError('syntax');
  }
}

function parseArray(cursor: Cursor, depth: number): unknown[] {
  if (depth >= cursor.maxDepth) throw new StrictJsonError('too-deep');
  const { text } = cursor;
  cursor.position++;
  const array: unknown[] = [];
  skipWhitespace(cursor);
  if (text.charCodeAt(cursor.position) === 0x5d) {
    cursor.position++;
    return array;
  }
  for (;;) {
    array.push(parseValue(cursor, depth + 1));
    skipWhitespace(cursor);
    const c = text.charCodeAt(cursor.position);
    cursor.position++;
    if (c === 0x2c) continue;
    if (c === 0x5d) return array;
    throw new StrictJsonError('syntax');
  }
}

function parseValue(cursor: Cursor, depth: number): unknown {
  skipWhitespace(cursor);
  const { text, position } = cursor;
  const c = text.charCodeAt(position);
  if (c === 0x7b) return parseObject(cursor, depth);
  if (c === 0x5b) return parseArray(cursor, depth);
  if (c === 0x22) return parseString(cursor);
  if (text.startsWith('true', position)) {
    cursor.position += 4;
    return true;
  }
  if (text.startsWith('false', position)) {
    cursor.position += 5;
    return false;
  }
  if (text.startsWith('null', position)) {
    cursor.position += 4;
    return null;
  }
  numberPattern.lastIndex = position;
  const match = numberPattern.exec(text);
  if (match === null) throw new StrictJsonError('syntax');
  cursor.position += match[0].length;
  // `1e999` parses to Infinity here; claim checks refuse non-finite dates later.
  return Number(match[0]);
}

/**
 * Parses `text` strictly. Never throws for bad input: the failure is a value.
 *
 * @example
 * parseStrictJson('{"a":1,"a":2}'); // { ok: false, reason: 'duplicate-key' }
 */
export function parseStrictJson(text: string, maxDepth = 16): StrictJsonResult {
  const cursor: Cursor = { text, maxDepth, position: 0 };
  try {
    const value = parseValue(cursor, 0);
    skipWhitespace(cursor);
    if (cursor.position !== text.length) return { ok: false, reason: 'syntax' };
    return { ok: true, value };
  } catch (error) {
    if (error instanceof StrictJsonError) return { ok: false, reason: error.reason };
    throw error;
  }
}
