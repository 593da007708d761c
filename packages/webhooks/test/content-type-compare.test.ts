// contentTypeAsCompared: one spelling for the content types RFC 9110 reads as one (5.6.6, 8.3.1),
// which outbox.add() compares by (outbox-add-as-sent.int.test.ts has the add() side).
import { describe, expect, it } from 'vitest';
import { contentTypeAsCompared } from '../src/content-type-compare.js';

const same = (a: string, b: string) => contentTypeAsCompared(a) === contentTypeAsCompared(b);

describe('contentTypeAsCompared', () => {
  it('reads parameter names, the charset value and the whitespace around ; in any spelling', () => {
    expect(same('application/json; charset=UTF-8', 'application/json;charset=utf-8')).toBe(true);
    expect(same(' Text/Plain \t; CHARSET="utf-8" ;', 'text/plain;charset=utf-8')).toBe(true);
    expect(same('text/plain; a="x\\"y"', 'text/plain;a="x\\"y"')).toBe(true);
    expect(same('text/plain; a="b"', 'text/plain; a=b')).toBe(true);
  });

  it('keeps other values, their order and their number as written', () => {
    expect(same('text/plain; a=B', 'text/plain; a=b')).toBe(false);
    expect(same('text/plain; a=1; b=2', 'text/plain; b=2; a=1')).toBe(false);
    expect(same('text/plain; charset=utf-8', 'text/plain')).toBe(false);
    // A value holding `;` or `=` is one value, not two parameters.
    expect(same('text/plain; a="1;b=2"', 'text/plain; a=1; b=2')).toBe(false);
  });

  it('compares a value that is no media type as before: its part before ; in any case, the rest as written', () => {
    expect(same('Text/Plain; a=b c', 'text/plain; a=b c')).toBe(true);
    expect(same('text/plain; a=b c', 'text/plain;a=b c')).toBe(false);
    expect(same('not a type', 'NOT A TYPE')).toBe(true);
    // Never the same as a value that parses.
    expect(same('text/plain;a="b', 'text/plain;a="b"')).toBe(false);
  });
});
