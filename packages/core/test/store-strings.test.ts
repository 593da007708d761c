import { describe, expect, it } from 'vitest';
import { assertStoreString } from '../src/index.js';

describe('assertStoreString', () => {
  it('accepts every well-formed string without U+0000: empty, astral (a surrogate pair), U+FFFD, other controls', () => {
    for (const value of ['', 'abc', '\ud83d\ude00', '\ud800\udc00', '\ufffd', '\u0001', '\u007f', '\uffff', 'é'])
      expect(() => assertStoreString(value, 'id')).not.toThrow();
  });

  it('refuses a lone surrogate (high, low, a pair reversed) and a NUL with a TypeError naming the argument, never the value', () => {
    for (const value of ['a\ud800', 'a\udc00', '\udc00\ud800', '\ud800', 'secret\u0000', '\u0000']) {
      let thrown: unknown;
      try {
        assertStoreString(value, 'token');
      } catch (error) {
        thrown = error;
      }
      expect(thrown).toBeInstanceOf(TypeError);
      expect((thrown as Error).message).toMatch(/^token must be well-formed UTF-16 without U\+0000/);
      expect((thrown as Error).message).not.toContain('secret');
    }
  });

  it('refuses what is not a string', () => {
    for (const value of [undefined, null, 42, {}, ['a']])
      expect(() => assertStoreString(value, 'fingerprint')).toThrow(new TypeError('fingerprint must be a string'));
  });
});
