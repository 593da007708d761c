import { describe, expect, it } from 'vitest';
import { recordId } from '../src/record-id.js';

describe('recordId', () => {
  it('hashes the length-framed parts (the same ids as every earlier version for well-formed text)', () => {
    // Computed outside the library: base64url(SHA-256("10:user:alice13:POST /charges3:k-1")).
    expect(recordId('user:alice', 'POST /charges', 'k-1')).toBe('t-V-tCnhByAE3enihlX7FJiMMu75uG5Z20Xyr4CgHVw');
  });

  it('keeps apart parts that differ only in lone surrogates, which UTF-8 would merge into U+FFFD', () => {
    const ids = new Set([
      recordId('user:\ud800', 'POST /charges', 'k'),
      recordId('user:\udc00', 'POST /charges', 'k'),
      recordId('user:\ufffd', 'POST /charges', 'k'),
      recordId('user:"\\ud800"', 'POST /charges', 'k'),
      recordId('user:a', 'POST /charges\ud800', 'k'),
      recordId('user:a', 'POST /charges\udbff', 'k'),
      recordId('user:a', 'POST /charges', 'k\ud800'),
      recordId('user:a', 'POST /charges', 'k\udfff'),
      recordId('user:a', 'POST /charges', 'k\ufffd'),
    ]);
    expect(ids.size).toBe(9);
    // A well-formed surrogate pair is ordinary text.
    expect(recordId('user:\ud83d\ude00', 'POST /charges', 'k')).toBe(recordId('user:😀', 'POST /charges', 'k'));
  });

  it('is not fooled by a framed-looking part', () => {
    // The JSON framing of a lone surrogate uses its own separator, so a well-formed part spelling it differs.
    const json = JSON.stringify('\ud800');
    expect(recordId('\ud800', 'op', 'k')).not.toBe(recordId(`${json}`, 'op', 'k'));
    expect(recordId('a', `${Buffer.byteLength(json)}!${json}op`, 'k')).not.toBe(recordId('a', '\ud800', 'k'));
  });
});
