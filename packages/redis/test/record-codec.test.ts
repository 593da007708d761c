import { type StoredResponse, storedResponseSize } from '@idem/core';
import { describe, expect, it } from 'vitest';
import {
  claimKeepMs,
  decodeRecord,
  encodeClaim,
  encodeOutcome,
  leasePrefix,
  RecordFormatError,
} from '../src/record-codec.js';

const bytes = (text: string) => Buffer.from(text, 'utf8');

describe('record codec', () => {
  it('writes a claim as p<token>\\n<fingerprint>\\n and reads it back', () => {
    expect(encodeClaim('t1', 'fp').toString()).toBe('p"t1"\n"fp"\n');
    expect(decodeRecord(encodeClaim('t1', 'fp'))).toEqual({ state: 'in_progress', token: 't1', fingerprint: 'fp' });
  });

  it('writes a claim kept after its lease with a keep line, and tells an abandoned one by its PTTL', () => {
    const claim = encodeClaim('t1', 'fp', 86_400_000);
    expect(claim.toString()).toBe('p"t1"\n"fp"\n86400000\n');
    expect(claimKeepMs(claim)).toBe(86_400_000);
    expect(claimKeepMs(encodeClaim('t1', 'fp'))).toBe(0);
    // No keep, no line: the value of a version that predates the keep.
    expect(encodeClaim('t1', 'fp', 0).toString()).toBe('p"t1"\n"fp"\n');
    const live = { state: 'in_progress', token: 't1', fingerprint: 'fp' };
    expect(decodeRecord(claim)).toEqual(live);
    expect(decodeRecord(claim, 86_400_001)).toEqual(live);
    expect(decodeRecord(claim, 86_400_000)).toEqual({ ...live, state: 'abandoned' });
    expect(decodeRecord(claim, 0)).toEqual({ ...live, state: 'abandoned' });
    // A key without an expiry (PTTL -1) is nobody's lease: never abandoned, never taken over.
    expect(decodeRecord(claim, -1)).toEqual(live);
    expect(decodeRecord(encodeClaim('t1', 'fp'), 0)).toEqual(live);
    expect(claim.subarray(0, leasePrefix('t1').length).equals(leasePrefix('t1'))).toBe(true);
  });

  it('refuses a keep that is not a whole number of milliseconds, 0 or more', () => {
    for (const keep of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, '5' as never]) {
      expect(() => encodeClaim('t', 'fp', keep)).toThrow(TypeError);
    }
    expect(() => claimKeepMs(bytes('c"t"\n"f"\n{"s":200,"h":{}}\n'))).toThrow(RecordFormatError);
  });

  it('makes the lease prefix a prefix of its own claim only', () => {
    const claim = encodeClaim('tok', 'fp');
    expect(claim.subarray(0, leasePrefix('tok').length).equals(leasePrefix('tok'))).toBe(true);
    // A token that is a prefix of another must not match it: the closing quote fences it.
    expect(encodeClaim('tok2', 'fp').subarray(0, leasePrefix('tok').length).equals(leasePrefix('tok'))).toBe(false);
  });

  it('reads a completed record as the completion script builds it', () => {
    const claim = encodeClaim('t\n"x', 'f\\p');
    const body = new Uint8Array([0, 10, 13, 255, 10]);
    const completed = Buffer.concat([
      bytes('c'),
      claim.subarray(1),
      encodeOutcome({ status: 204, headers: { a: 'b\nc' }, body }),
    ]);
    const record = decodeRecord(completed);
    expect(record).toEqual({
      state: 'completed',
      token: 't\n"x',
      fingerprint: 'f\\p',
      response: { status: 204, headers: { a: 'b\nc' }, body },
    });
  });

  it('copies the body out of the reply buffer', () => {
    const completed = Buffer.concat([
      bytes('c"t"\n""\n'),
      encodeOutcome({ status: 200, headers: {}, body: new Uint8Array([1, 2]) }),
    ]);
    const record = decodeRecord(completed);
    completed[completed.length - 1] = 9;
    expect(record.state === 'completed' && [...record.response.body]).toEqual([1, 2]);
  });

  it.each([
    ['empty', ''],
    ['another app value', 'hello'],
    ['truncated claim', 'p"t"\n'],
    ['claim with trailing bytes', 'p"t"\n"f"\nx'],
    ['claim with a keep line of 0', 'p"t"\n"f"\n0\n'],
    ['claim with a keep line of letters', 'p"t"\n"f"\n12a\n'],
    ['claim with a keep line without its newline', 'p"t"\n"f"\n120'],
    ['claim with bytes after its keep line', 'p"t"\n"f"\n120\nx'],
    ['claim with a keep beyond any retention', 'p"t"\n"f"\n99999999999999999\n'],
    ['completed without meta', 'c"t"\n"f"\n'],
    ['token not a string', 'p1\n"f"\n'],
    ['meta without status', 'c"t"\n"f"\n{"h":{}}\n'],
    ['headers not strings', 'c"t"\n"f"\n{"s":200,"h":{"a":1}}\n'],
    // Each of these would pass a check that only asks "are all the values strings?" and replay as
    // headers that are no header map at all.
    ['headers an array', 'c"t"\n"f"\n{"s":200,"h":["a"]}\n'],
    ['headers a string', 'c"t"\n"f"\n{"s":200,"h":"ab"}\n'],
    ['headers null', 'c"t"\n"f"\n{"s":200,"h":null}\n'],
    ['meta null', 'c"t"\n"f"\nnull\n'],
    // Without its newline the meta line has no end: reading up to the value's last byte instead
    // would parse '{"s":200,"h":{}}' and take the whole value for the body.
    ['meta line without its newline', 'c"t"\n"f"\n{"s":200,"h":{}}}'],
    ['invalid UTF-8 in JSON', Buffer.from([0x70, 0x22, 0xff, 0x22, 0x0a, 0x22, 0x22, 0x0a])],
  ])('refuses %s with RecordFormatError', (_, value) => {
    expect(() => decodeRecord(typeof value === 'string' ? bytes(value) : value)).toThrow(RecordFormatError);
  });

  it('is as long as storedResponseSize says, so maxResponseBytes caps what Redis keeps', () => {
    const responses: StoredResponse[] = [
      { status: 201, headers: {}, body: new Uint8Array(0) },
      { status: 599, headers: { 'content-type': 'application/json', etag: '"é\t"' }, body: new Uint8Array(950) },
      { status: 201, headers: {}, body: new Uint8Array(3), statusMessage: 'Créé "fine"' },
    ];
    for (const response of responses) expect(encodeOutcome(response).length).toBe(storedResponseSize(response));
  });

  it('keeps a handler\'s own reason phrase as an "m" member; a record without one is written and read as before', () => {
    const claim = encodeClaim('t', 'f');
    const body = new Uint8Array([1]);
    const withPhrase = Buffer.concat([
      claim,
      encodeOutcome({ status: 201, headers: {}, body, statusMessage: 'Created Fine' }),
    ]);
    withPhrase[0] = 0x63;
    expect(withPhrase.toString()).toBe('c"t"\n"f"\n{"s":201,"h":{},"m":"Created Fine"}\n\u0001');
    expect(decodeRecord(withPhrase)).toEqual({
      state: 'completed',
      token: 't',
      fingerprint: 'f',
      response: { status: 201, headers: {}, body, statusMessage: 'Created Fine' },
    });
    // A record of a version before the phrase: the same bytes as ever, and no statusMessage read back.
    expect(encodeOutcome({ status: 201, headers: {}, body }).toString()).toBe('{"s":201,"h":{}}\n\u0001');
    const old = decodeRecord(bytes('c"t"\n"f"\n{"s":201,"h":{}}\n\u0001'));
    expect(old.state === 'completed' && 'statusMessage' in old.response).toBe(false);
    expect(() => decodeRecord(bytes('c"t"\n"f"\n{"s":201,"h":{},"m":7}\n'))).toThrow(RecordFormatError);
  });

  it('refuses to encode a claim whose token or fingerprint is not a string', () => {
    expect(() => encodeClaim(1 as never, 'fp')).toThrow(TypeError);
    expect(() => encodeClaim('t', undefined as never)).toThrow(TypeError);
  });
});
