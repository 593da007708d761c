/**
 * RFC 8785 (JSON Canonicalization Scheme) serialisation of a parsed JSON value: object members
 * sorted by their UTF-16 code units, no whitespace, numbers and strings as ECMAScript's
 * `JSON.stringify` writes them (which is what RFC 8785 specifies).
 *
 * Returns `undefined` for values deeper than `maxDepth`, so hostile nesting cannot exhaust the stack;
 * the caller then hashes the raw bytes instead.
 */
export function canonicalJson(value: unknown, maxDepth = 512): string | undefined {
  try {
    return write(value, maxDepth);
  } catch (error) {
    if (error === tooDeep) return undefined;
    throw error;
  }
}

const tooDeep = Symbol('too deep');

function write(value: unknown, depth: number): string {
  if (value === null || typeof value === 'boolean' || typeof value === 'number' || typeof value === 'string') {
    return JSON.stringify(value);
  }
  if (depth <= 0) throw tooDeep;
  if (Array.isArray(value)) {
    return `[${value.map((item) => write(item, depth - 1)).join(',')}]`;
  }
  const object = value as Record<string, unknown>;
  // Default sort compares UTF-16 code units, exactly the order RFC 8785 requires.
  const keys = Object.keys(object).sort();
  let out = '{';
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i] as string;
    if (i > 0) out += ',';
    out += `${JSON.stringify(key)}:${write(object[key], depth - 1)}`;
  }
  return `${out}}`;
}
