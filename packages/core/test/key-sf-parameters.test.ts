// research/idempotency-anchors.md section 7, case 28; section 1: the draft makes the field an RFC
// 8941 Item, now RFC 9651. The parameters of an sf-string key are ignored whatever bare item they
// hold, and a field whose parameters are no bare items is malformed (400 key_invalid).
import { describe, expect, it } from 'vitest';
import { parseIdempotencyKey } from '../src/key.js';

const keyOf = (value: string) => {
  const parsed = parseIdempotencyKey(value);
  return parsed.ok ? parsed.key : parsed.error.code;
};

describe('parseIdempotencyKey: sf-string parameters of every bare-item type (case 28)', () => {
  it('trims the blanks around a field value in linear time, however many there are inside it', () => {
    expect(keyOf(' \t"abc" \t')).toBe('abc');
    expect(keyOf(`a${' '.repeat(16_000)}b`)).toBe('key_invalid');
    // Trimmed by a regex, 16,000 interior blanks took about 400 ms and 100,000 would take tens of
    // seconds (the test's timeout); in one pass they take well under a millisecond.
    expect(keyOf(`"${'a'.repeat(10)}"${' \t'.repeat(50_000)}x`)).toBe('key_invalid');
  });

  it('ignores a byte-sequence parameter (RFC 8941 3.3.5), as it ignores the others', () => {
    expect(keyOf('"abc";sig=:aGVsbG8=:')).toBe('abc');
    expect(keyOf('"abc";sig=::')).toBe('abc');
    expect(keyOf('"abc";sig=:a+b/:;n=1')).toBe('abc');
    expect(keyOf('"abc";sig=:aGVs bG8=:')).toBe('key_invalid');
    expect(keyOf('"abc";sig=:aGVsbG8=')).toBe('key_invalid');
    expect(keyOf('"abc";sig=:a=b:')).toBe('key_invalid');
    // Base64 that does not decode (RFC 9651 4.2.7): a lone character, a group of five, too much padding.
    expect(keyOf('"abc";sig=:aGVsbG8:')).toBe('abc');
    expect(keyOf('"abc";sig=:aGVsbA:')).toBe('abc');
    expect(keyOf('"abc";sig=:a:')).toBe('key_invalid');
    expect(keyOf('"abc";sig=:abcde:')).toBe('key_invalid');
    expect(keyOf('"abc";sig=:aGVsbG8=====:')).toBe('key_invalid');
    expect(keyOf('"abc";sig=:aGVsbA=:')).toBe('key_invalid');
  });

  it('ignores a date (RFC 9651 3.3.7) and a display-string (RFC 9651 3.3.8) parameter', () => {
    expect(keyOf('"abc";at=@1700000000')).toBe('abc');
    expect(keyOf('"abc";at=@-1')).toBe('abc');
    expect(keyOf('"abc";note=%"caf%c3%a9"')).toBe('abc');
    expect(keyOf('"abc";note=%""; n=?1')).toBe('abc');
    expect(keyOf('"abc";at=@1.5')).toBe('key_invalid');
    expect(keyOf('"abc";at=@1234567890123456')).toBe('key_invalid');
    // Escapes are lower-case hex (RFC 9651 4.2.10), a lone % is none, and they must spell UTF-8.
    expect(keyOf('"abc";note=%"caf%C3%A9"')).toBe('key_invalid');
    expect(keyOf('"abc";note=%"50%"')).toBe('key_invalid');
    expect(keyOf('"abc";note=%"%c3"')).toBe('key_invalid');
    expect(keyOf('"abc";note=%"%ff%fe"')).toBe('key_invalid');
    expect(keyOf('"abc";note="caf%c3%a9"')).toBe('abc');
  });

  it('takes integers of up to 15 digits and decimals of up to 12.3 digits (RFC 9651 3.3.1, 3.3.2)', () => {
    expect(keyOf('"abc";v=123456789012345')).toBe('abc');
    expect(keyOf('"abc";v=-123456789012.123')).toBe('abc');
    expect(keyOf('"abc";v=1234567890123456')).toBe('key_invalid');
    expect(keyOf('"abc";v=1234567890123.5')).toBe('key_invalid');
    expect(keyOf('"abc";v=1.2345')).toBe('key_invalid');
    expect(keyOf('"abc";v=1.')).toBe('key_invalid');
  });

  it('refuses a string parameter with a control character, non-ASCII or a bad escape', () => {
    expect(keyOf('"abc";s="a\\"b"')).toBe('abc');
    expect(keyOf('"abc";s="a\tb"')).toBe('key_invalid');
    expect(keyOf('"abc";s="caf\u00e9"')).toBe('key_invalid');
    expect(keyOf('"abc";s="a\\b"')).toBe('key_invalid');
  });
});

// Mutation audit of the parameter grammar and trimBlanks: each case below pins one boundary of an
// RFC 9651 production (or one side of the trim) that the cases above leave open.
describe('parseIdempotencyKey: the edges of each parameter production (mutation audit)', () => {
  it('trims blanks on one side only as well as on both', () => {
    expect(keyOf('"abc" \t')).toBe('abc');
    expect(keyOf('abc\t')).toBe('abc');
    expect(keyOf(' \t"abc"')).toBe('abc');
    expect(keyOf('\tabc')).toBe('abc');
  });

  it('parameter keys: lower case, digits, _ . * - after the first, which is a letter or *', () => {
    expect(keyOf('"abc";*a=1')).toBe('abc');
    expect(keyOf('"abc";a*b.c_d-e9=1')).toBe('abc');
    expect(keyOf('"abc";1a=1')).toBe('key_invalid');
    expect(keyOf('"abc";aB=1')).toBe('key_invalid');
    // Any number of spaces after `;` (RFC 9651 4.2.3.2), and a key alone is the boolean true.
    expect(keyOf('"abc";   a=1')).toBe('abc');
    expect(keyOf('"abc";flag')).toBe('abc');
    expect(keyOf('"abc";flag;n=?0')).toBe('abc');
  });

  it('each parameter starts where the one before ended: garbage before a good parameter is refused', () => {
    expect(keyOf('"abc"x;a=1')).toBe('key_invalid');
    expect(keyOf('"abc";a=1 ;b=2')).toBe('key_invalid');
  });

  it('string parameters: space and both escapes are in, any other escape and DEL are out', () => {
    expect(keyOf('"abc";s="a b"')).toBe('abc');
    expect(keyOf('"abc";s="a\\\\b"')).toBe('abc');
    expect(keyOf('"abc";s="a\\nb"')).toBe('key_invalid');
    expect(keyOf('"abc";s="a\u007fb"')).toBe('key_invalid');
  });

  it('token parameters: a letter or * first, then tchar, : and /, never a comma', () => {
    expect(keyOf('"abc";t=*foo')).toBe('abc');
    expect(keyOf('"abc";t=text/plain:x')).toBe('abc');
    expect(keyOf('"abc";t=a,b')).toBe('key_invalid');
  });

  it('numbers: a decimal needs a digit before the point; booleans are ?0 and ?1 only', () => {
    expect(keyOf('"abc";v=.5')).toBe('key_invalid');
    expect(keyOf('"abc";v=-.5')).toBe('key_invalid');
    expect(keyOf('"abc";b=?0')).toBe('abc');
    expect(keyOf('"abc";b=?2')).toBe('key_invalid');
  });

  it('dates take 15 digits, as integers do', () => {
    expect(keyOf('"abc";at=@123456789012345')).toBe('abc');
    expect(keyOf('"abc";at=@-123456789012345')).toBe('abc');
  });

  it('display strings: space and \\ are in, a bare " ends the string', () => {
    expect(keyOf('"abc";note=%"a b"')).toBe('abc');
    expect(keyOf('"abc";note=%"a\\b"')).toBe('abc');
    expect(keyOf('"abc";note=%"a"b"')).toBe('key_invalid');
  });
});
