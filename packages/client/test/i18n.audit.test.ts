// Audit (internationalisation): the client reads a text response in the charset it declares. A
// Shift_JIS or latin1 page read as UTF-8 comes out as replacement characters, with no error to say so.
import { describe, expect, it } from 'vitest';
import { decodeBody } from '../src/response-body.js';

const shiftJis = new Uint8Array([0x93, 0xfa, 0x96, 0x7b, 0x8c, 0xea]); // 日本語
const latin1 = new Uint8Array([0x63, 0x61, 0x66, 0xe9]); // café

describe('text bodies in their declared charset', () => {
  it.each([
    ['text/plain; charset=shift_jis', shiftJis, '日本語'],
    ['text/plain; charset="Shift_JIS"', shiftJis, '日本語'],
    ['text/html; charset=ISO-8859-1', latin1, 'café'],
    ['text/plain; charset=utf-8', new TextEncoder().encode('café'), 'café'],
    ['text/plain', new TextEncoder().encode('café'), 'café'],
  ])('%s', (contentType, bytes, text) => {
    expect(decodeBody(bytes, contentType, 'auto')).toBe(text);
    expect(decodeBody(bytes, contentType, 'text')).toBe(text);
  });

  it('a charset no decoder knows is read as UTF-8, as before', () => {
    expect(decodeBody(new TextEncoder().encode('café'), 'text/plain; charset=x-unknown', 'auto')).toBe('café');
  });

  it('JSON is UTF-8 whatever it declares (RFC 8259 §8.1), its BOM ignored', () => {
    const bytes = new Uint8Array([0xef, 0xbb, 0xbf, ...new TextEncoder().encode('{"a":"ü"}')]);
    expect(decodeBody(bytes, 'application/json; charset=iso-8859-1', 'auto')).toEqual({ a: 'ü' });
  });
});
