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

  // Was a defect: a byte order mark named the encoding less than the label did, so UTF-8 text sent
  // with a wrong `charset=iso-8859-1` came back as mojibake (`ï»¿cafÃ©`). WHATWG's decode, what
  // fetch's text() and every browser use, takes the BOM first, and drops it.
  it('a byte order mark wins over the declared charset, and is dropped', () => {
    const utf8 = new Uint8Array([0xef, 0xbb, 0xbf, ...new TextEncoder().encode('café')]);
    expect(decodeBody(utf8, 'text/plain; charset=iso-8859-1', 'text')).toBe('café');
    const utf16le = new Uint8Array([0xff, 0xfe, 0x63, 0x00, 0xe9, 0x00]);
    expect(decodeBody(utf16le, 'text/plain; charset=utf-8', 'auto')).toBe('cé');
    const utf16be = new Uint8Array([0xfe, 0xff, 0x00, 0x63, 0x00, 0xe9]);
    expect(decodeBody(utf16be, 'text/plain; charset=shift_jis', 'auto')).toBe('cé');
    // Without a BOM the label decides, as before.
    expect(decodeBody(new Uint8Array([0x63, 0xe9]), 'text/plain; charset=iso-8859-1', 'text')).toBe('cé');
  });

  it('a charset no decoder knows is read as UTF-8, as before', () => {
    expect(decodeBody(new TextEncoder().encode('café'), 'text/plain; charset=x-unknown', 'auto')).toBe('café');
  });

  it('JSON is UTF-8 whatever it declares (RFC 8259 §8.1), its BOM ignored', () => {
    const bytes = new Uint8Array([0xef, 0xbb, 0xbf, ...new TextEncoder().encode('{"a":"ü"}')]);
    expect(decodeBody(bytes, 'application/json; charset=iso-8859-1', 'auto')).toEqual({ a: 'ü' });
  });
});
