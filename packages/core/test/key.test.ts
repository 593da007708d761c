import { describe, expect, it } from 'vitest';
import { parseIdempotencyKey } from '../src/key.js';

const keyOf = (value: string | string[] | undefined, strict = false) => {
  const parsed = parseIdempotencyKey(value, { strict });
  return parsed.ok ? parsed.key : parsed.error.code;
};

describe('parseIdempotencyKey', () => {
  it('case 25: a missing key is key_missing (400)', () => {
    const parsed = parseIdempotencyKey(undefined);
    expect(parsed.ok).toBe(false);
    if (parsed.ok) return;
    expect(parsed.error.code).toBe('key_missing');
    expect(parsed.error.status).toBe(400);
    expect(parsed.error.toProblem()).toMatchObject({
      title: 'Idempotency-Key is missing',
      type: 'https://idem.dev/problems/key-missing',
    });
    expect(keyOf([])).toBe('key_missing');
  });

  it('case 26: empty, whitespace-only and control characters are refused', () => {
    // Line breaks too, bare or quoted, whatever framing let them through (case 22).
    for (const bad of [
      '',
      '   ',
      '""',
      '" "',
      '"   "',
      'a\u0000b',
      '"a\tb"',
      'a\u007fb',
      '\t',
      'a\nb',
      '"a\nb"',
      'a\r\nb',
      '"a\rb"',
      'a\n',
    ]) {
      expect(keyOf(bad)).toBe('key_invalid');
    }
  });

  it('case 26: the limit counts bytes; 255 is fine, 256 is not; non-ASCII is refused', () => {
    expect(keyOf('a'.repeat(255))).toBe('a'.repeat(255));
    expect(keyOf('a'.repeat(256))).toBe('key_invalid');
    expect(keyOf(`"${'a'.repeat(255)}"`)).toBe('a'.repeat(255));
    expect(keyOf(`"${'a'.repeat(256)}"`)).toBe('key_invalid');
    expect(keyOf('clé')).toBe('key_invalid');
    expect(keyOf('"clé"')).toBe('key_invalid');
    expect(parseIdempotencyKey('abcd', { maxBytes: 3 }).ok).toBe(false);
  });

  it('case 27: two fields or a comma-joined list are refused', () => {
    expect(keyOf(['a', 'a'])).toBe('key_invalid');
    expect(keyOf(['"a"', '"b"'])).toBe('key_invalid');
    expect(keyOf('"a", "b"')).toBe('key_invalid');
    expect(keyOf('a,b')).toBe('key_invalid');
    expect(keyOf('"a",')).toBe('key_invalid');
  });

  it('case 28: "abc" and abc are the same key; strict mode refuses the bare form', () => {
    expect(keyOf('"abc"')).toBe('abc');
    expect(keyOf('abc')).toBe('abc');
    expect(keyOf(['  "abc"  '])).toBe('abc');
    expect(keyOf('abc', true)).toBe('key_invalid');
    expect(keyOf('"abc"', true)).toBe('abc');
  });

  it('case 28: sf-string escapes, parameters and malformed structured fields', () => {
    expect(keyOf('"a\\"b"')).toBe('a"b');
    expect(keyOf('"a\\\\b"')).toBe('a\\b');
    expect(keyOf('"a,b"')).toBe('a,b');
    expect(keyOf('"abc";v=1')).toBe('abc');
    expect(keyOf('"abc";ttl=?1')).toBe('abc');
    for (const bad of [
      '"abc',
      '"a\\b"',
      '"abc"x',
      '"abc" "def"',
      '"abc";',
      '"abc";V=1',
      'a"b',
      'a;b',
      'a\\b',
      '"abc";v="x',
    ]) {
      expect(keyOf(bad), bad).toBe('key_invalid');
    }
  });

  it('accepts a UUID in both spellings', () => {
    const uuid = '8e03978e-40d5-43e8-bc93-6894a57f9324';
    expect(keyOf(uuid)).toBe(uuid);
    expect(keyOf(`"${uuid}"`)).toBe(uuid);
  });

  it('never echoes the key in an error message', () => {
    const secretish = 'x'.repeat(300);
    const parsed = parseIdempotencyKey(secretish);
    expect(parsed.ok).toBe(false);
    if (!parsed.ok) expect(parsed.error.message).not.toContain('xxxx');
  });

  it('optional whitespace around the field value is spaces and tabs (RFC 9110 5.5)', () => {
    expect(keyOf('\t"abc" \t')).toBe('abc');
    expect(keyOf('\tabc\t')).toBe('abc');
  });

  it('a bare key is visible ASCII: a space inside it is refused (it needs the quoted form)', () => {
    expect(keyOf('a b')).toBe('key_invalid');
    expect(keyOf('"a b"')).toBe('a b');
  });

  it('a quoted key is printable ASCII: DEL is refused there too', () => {
    expect(keyOf('"a\u007fb"')).toBe('key_invalid');
  });

  it('parameters follow RFC 9651: integers of at most 15 digits, decimals of at most 3 fraction digits, spaces only after ;', () => {
    expect(keyOf('"abc";v=123456789012345')).toBe('abc');
    expect(keyOf('"abc";v=1.125')).toBe('abc');
    expect(keyOf('"abc"; v=1')).toBe('abc');
    for (const bad of ['"abc";v=1234567890123456', '"abc";v=1.1234', '"abc";\tv=1']) {
      expect(keyOf(bad), bad).toBe('key_invalid');
    }
  });
});
