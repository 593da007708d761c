// Audit (research/idempotency-anchors.md section 7, case 28; section 1: the draft makes the field an
// RFC 8941 Item, now RFC 9651): parameters of a valid sf-string key are ignored, whatever bare item
// they hold. The parameter grammar of parseSfString knows strings, tokens, numbers and booleans only,
// so a byte sequence (RFC 8941 3.3.5), a date (RFC 9651 3.3.7) or a display string (RFC 9651 3.3.8)
// turns a well-formed field into 400 key_invalid; and a decimal whose integer part has more than 12
// digits, which RFC 9651 3.3.2 refuses, passes as a well-formed field.
import { describe, expect, it } from 'vitest';
import { parseIdempotencyKey } from '../src/key.js';

const keyOf = (value: string) => {
  const parsed = parseIdempotencyKey(value);
  return parsed.ok ? parsed.key : parsed.error.code;
};

describe('parseIdempotencyKey: sf-string parameters of every bare-item type (case 28)', () => {
  it.fails('ignores a byte-sequence parameter (RFC 8941 3.3.5), as it ignores the others', () => {
    expect(keyOf('"abc";sig=:aGVsbG8=:')).toBe('abc');
  });

  it.fails('ignores a date (RFC 9651 3.3.7) and a display-string (RFC 9651 3.3.8) parameter', () => {
    expect(keyOf('"abc";at=@1700000000')).toBe('abc');
    expect(keyOf('"abc";note=%"caf%c3%a9"')).toBe('abc');
  });

  it.fails('refuses a decimal parameter with more than 12 integer digits (RFC 9651 3.3.2): the field is malformed', () => {
    expect(keyOf('"abc";v=1234567890123.5')).toBe('key_invalid');
  });
});
