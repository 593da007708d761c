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

/**
 * Parses `text` strictly. Never throws for bad input: the failure is a value.
 *
 * @example
 * parseStrictJson('{"a":1,"a":2}'); // { ok: false, reason: 'duplicate-key' }
 */
export function parseStrictJson(text: string, maxDepth = 16): StrictJsonResult {
  let position = 0;

  const skipWhitespace = (): void => {
    while (position < text.length) {
      const c = text.charCodeAt(position);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) position++;
      else break;
    }
  };

  const parseString = (): string => {
    // position is at the opening quote; find the closing one, skipping escapes.
    let end = position + 1;
    while (end < text.length) {
      const c = text.charCodeAt(end);
      if (c === 0x22) break;
      if (c === 0x5c) end += 2;
      else end++;
    }
    if (end >= text.length) throw new StrictJsonError('syntax');
    const raw = text.slice(position, end + 1);
    position = end + 1;
    try {
      return JSON.parse(raw) as string;
    } catch {
      throw new StrictJsonError('syntax');
    }
  };

  const parseValue = (depth: number): unknown => {
    skipWhitespace();
    const c = text[position];
    if (c === '{') {
      if (depth >= maxDepth) throw new StrictJsonError('too-deep');
      position++;
      const object: Record<string, unknown> = {};
      const seen = new Set<string>();
      skipWhitespace();
      if (text[position] === '}') {
        position++;
        return object;
      }
      for (;;) {
        skipWhitespace();
        if (text[position] !== '"') throw new StrictJsonError('syntax');
        const key = parseString();
        if (key === '__proto__') throw new StrictJsonError('proto-key');
        if (seen.has(key)) throw new StrictJsonError('duplicate-key');
        seen.add(key);
        skipWhitespace();
        if (text[position] !== ':') throw new StrictJsonError('syntax');
        position++;
        object[key] = parseValue(depth + 1);
        skipWhitespace();
        if (text[position] === ',') {
          position++;
          continue;
        }
        if (text[position] === '}') {
          position++;
          return object;
        }
        throw new StrictJsonError('syntax');
      }
    }
    if (c === '[') {
      if (depth >= maxDepth) throw new StrictJsonError('too-deep');
      position++;
      const array: unknown[] = [];
      skipWhitespace();
      if (text[position] === ']') {
        position++;
        return array;
      }
      for (;;) {
        array.push(parseValue(depth + 1));
        skipWhitespace();
        if (text[position] === ',') {
          position++;
          continue;
        }
        if (text[position] === ']') {
          position++;
          return array;
        }
        throw new StrictJsonError('syntax');
      }
    }
    if (c === '"') return parseString();
    if (text.startsWith('true', position)) {
      position += 4;
      return true;
    }
    if (text.startsWith('false', position)) {
      position += 5;
      return false;
    }
    if (text.startsWith('null', position)) {
      position += 4;
      return null;
    }
    numberPattern.lastIndex = position;
    const match = numberPattern.exec(text);
    if (match === null) throw new StrictJsonError('syntax');
    position += match[0].length;
    // `1e999` parses to Infinity here; claim checks refuse non-finite dates later.
    return Number(match[0]);
  };

  try {
    const value = parseValue(0);
    skipWhitespace();
    if (position !== text.length) return { ok: false, reason: 'syntax' };
    return { ok: true, value };
  } catch (error) {
    if (error instanceof StrictJsonError) return { ok: false, reason: error.reason };
    throw error;
  }
}
