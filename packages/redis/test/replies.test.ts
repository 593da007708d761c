import { describe, expect, it } from 'vitest';
import { integerReply, isOk } from '../src/replies.js';

describe('integerReply', () => {
  it.each([
    ['a number', 1, 1],
    ['a decimal string', '1', 1],
    ['bytes', Buffer.from('0'), 0],
    ['a bigint', 1n, 1],
    ['a negative string', '-1', -1],
    ['negative bytes', Buffer.from('-12'), -12],
  ])('reads %s', (_, reply, expected) => {
    expect(integerReply(reply)).toBe(expected);
  });

  it.each([
    // RESP integers are whole numbers: a fraction is some other reply, not an integer one.
    ['a fraction', 1.5],
    ['a fraction as text', '1.0'],
    // RESP writes no plus sign and no padding: anything around the digits means it is not RESP's form.
    ['a plus sign', '+1'],
    ['a leading space', ' 1'],
    ['a status reply', 'OK'],
    // Past 15 digits the text may not fit a double exactly; it is no reply the store could trust.
    ['sixteen digits', '9999999999999999'],
    ['nil', null],
  ])('refuses %s', (_, reply) => {
    expect(integerReply(reply)).toBeUndefined();
  });
});

describe('isOk', () => {
  it('accepts OK as a string or as the two bytes O K', () => {
    expect(isOk('OK')).toBe(true);
    expect(isOk(Buffer.from('OK'))).toBe(true);
    expect(isOk(new Uint8Array([0x4f, 0x4b]))).toBe(true);
  });

  it('refuses nil and any other bytes, a longer value starting with OK too', () => {
    expect(isOk(null)).toBe(false);
    expect(isOk(Buffer.from('ok'))).toBe(false);
    expect(isOk(Buffer.from('OKAY'))).toBe(false);
    expect(isOk(Buffer.from('O'))).toBe(false);
  });
});
