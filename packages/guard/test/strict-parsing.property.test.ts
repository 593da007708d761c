import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decodeCanonicalBase64url } from '../src/compact-jws.js';
import { parseStrictJson } from '../src/strict-json.js';

const json = fc.jsonValue({ maxDepth: 6 }).filter((value) => !JSON.stringify(value).includes('"__proto__"'));

describe('strict parsing (properties)', () => {
  it('agrees with JSON.parse on every document without duplicate keys or __proto__', () => {
    fc.assert(
      fc.property(json, (value) => {
        const text = JSON.stringify(value);
        const parsed = parseStrictJson(text, 16);
        expect(parsed.ok).toBe(true);
        if (parsed.ok) expect(parsed.value).toEqual(JSON.parse(text));
      }),
      { numRuns: 500 },
    );
  });

  it('refuses any object with a repeated member name', () => {
    fc.assert(
      fc.property(fc.string(), fc.jsonValue(), fc.jsonValue(), (key, first, second) => {
        const text = `{${JSON.stringify(key)}:${JSON.stringify(first)},${JSON.stringify(key)}:${JSON.stringify(second)}}`;
        const parsed = parseStrictJson(text, 64);
        expect(parsed.ok).toBe(false);
      }),
      { numRuns: 300 },
    );
  });

  it('reads a string exactly as JSON.parse does, escapes and control characters included', () => {
    // Strings without a backslash skip JSON.parse: a raw control character must still be refused.
    expect(parseStrictJson('{"a":"x\ty"}').ok).toBe(false);
    expect(parseStrictJson('{"a":"\\u0041\\n"}')).toEqual({ ok: true, value: { a: 'A\n' } });
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 24 }), (content) => {
        const text = `"${content}"`;
        let expected: unknown;
        try {
          expected = { ok: true, value: JSON.parse(text) };
        } catch {
          expected = { ok: false, reason: 'syntax' };
        }
        expect(parseStrictJson(text)).toEqual(expected);
      }),
      { numRuns: 2000 },
    );
  });

  it('refuses what JSON.parse refuses around values: leading zeros, form feed as whitespace, trailing text', () => {
    for (const text of [
      '{"exp":01}',
      '{"exp":-01}',
      '[00]',
      '{\f"a":1}',
      '[1,\f2]',
      '{"a":1}x',
      '{"a":1}{"b":2}',
      '[1] 2',
    ]) {
      expect(() => JSON.parse(text), text).toThrow(SyntaxError);
      expect(parseStrictJson(text), text).toEqual({ ok: false, reason: 'syntax' });
    }
    expect(parseStrictJson(' \t\r\n{"a" : [ 0 , -0.5e3 ] }\n')).toEqual({ ok: true, value: { a: [0, -500] } });
  });

  it('maxDepth is the deepest nesting accepted, for objects and arrays alike', () => {
    expect(parseStrictJson('[[]]', 2).ok).toBe(true);
    expect(parseStrictJson('[[[]]]', 2)).toEqual({ ok: false, reason: 'too-deep' });
    expect(parseStrictJson('{"a":{}}', 2).ok).toBe(true);
    expect(parseStrictJson('{"a":{"b":{}}}', 2)).toEqual({ ok: false, reason: 'too-deep' });
    expect(parseStrictJson('[{"a":[]}]', 3).ok).toBe(true);
    expect(parseStrictJson('{"a":[{}]}', 2)).toEqual({ ok: false, reason: 'too-deep' });
  });
  it('never throws on arbitrary text', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 200 }), (text) => {
        parseStrictJson(text, 16);
      }),
      { numRuns: 1000 },
    );
  });

  it('base64url: exactly one accepted spelling per byte string', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
        const text = Buffer.from(bytes).toString('base64url');
        expect(decodeCanonicalBase64url(text)).toEqual(new Uint8Array(bytes));
        expect(decodeCanonicalBase64url(`${text}=`)).toBeUndefined();
      }),
      { numRuns: 500 },
    );
    fc.assert(
      fc.property(fc.string({ maxLength: 40 }), (text) => {
        const decoded = decodeCanonicalBase64url(text);
        if (decoded !== undefined) expect(Buffer.from(decoded).toString('base64url')).toBe(text);
      }),
      { numRuns: 1000 },
    );
    // Every string of the alphabet: accepted exactly when re-encoding its bytes gives it back, so
    // the tail-bit check stands for the round trip (random strings rarely reach a 2- or 3-char tail).
    fc.assert(
      fc.property(fc.stringMatching(/^[A-Za-z0-9_-]{0,11}$/), (text) => {
        const bytes = Buffer.from(text, 'base64url');
        const canonical = text.length % 4 !== 1 && bytes.toString('base64url') === text;
        expect(decodeCanonicalBase64url(text) !== undefined).toBe(canonical);
      }),
      { numRuns: 3000 },
    );
  });
});
