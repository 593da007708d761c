// recordId must be injective over (scope, operation, key): two callers, two operations or two keys
// that differ in any way never share a record, whatever characters they hold. The dangerous pairs
// are those a plain join would merge: one string split at two different places (scope 'a:b' with
// key 'c' against scope 'a' with key 'b:c'), framing-like text, NUL, lone surrogates.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { recordId } from '../src/record-id.js';

// Strings rich in separators, digits (a length prefix is digits), framing characters and code
// units that have no UTF-8 form.
const part = fc.string({
  unit: fc.constantFrom(
    'a',
    'b',
    ':',
    '|',
    '/',
    ' ',
    '0',
    '1',
    '!',
    '"',
    '\\',
    '\u0000',
    '\ud800',
    '\udc00',
    '\ufffd',
    'é',
  ),
  maxLength: 8,
});

describe('recordId (property)', () => {
  it('gives different ids to every different split of one string into scope, operation and key', () => {
    fc.assert(
      fc.property(part, fc.nat(), fc.nat(), fc.nat(), fc.nat(), (text, a, b, c, d) => {
        const cut = (x: number, y: number): [string, string, string] => {
          const i = x % (text.length + 1);
          const j = i + (y % (text.length - i + 1));
          return [text.slice(0, i), text.slice(i, j), text.slice(j)];
        };
        const first = cut(a, b);
        const second = cut(c, d);
        const same = first.every((value, index) => value === second[index]);
        expect(recordId(...first) === recordId(...second)).toBe(same);
      }),
      { numRuns: 2_000 },
    );
  });

  it('gives different ids to different triples', () => {
    fc.assert(
      fc.property(fc.tuple(part, part, part), fc.tuple(part, part, part), (first, second) => {
        const same = first.every((value, index) => value === second[index]);
        expect(recordId(...first) === recordId(...second)).toBe(same);
      }),
      { numRuns: 2_000 },
    );
  });

  it('is the same for one triple however the calls around it vary (the cached prefix is only a shortcut)', () => {
    fc.assert(
      fc.property(fc.tuple(part, part, part), fc.tuple(part, part, part), (triple, other) => {
        const alone = recordId(...triple);
        recordId(...other);
        expect(recordId(...triple)).toBe(alone);
        recordId(triple[0], triple[1], other[2]);
        expect(recordId(...triple)).toBe(alone);
      }),
    );
  });
});
