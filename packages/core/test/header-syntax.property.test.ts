// The engine's header checks are written locally (so @idem/core needs no node:http on Workers), but
// a stored header must still be one Node's writeHead takes on replay: they must accept and refuse
// exactly what Node's validateHeaderName and validateHeaderValue do, on every input.
import { validateHeaderName, validateHeaderValue } from 'node:http';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { isFieldValue, isHttpToken } from '../src/header-syntax.js';

const nodeAcceptsName = (name: string): boolean => {
  try {
    validateHeaderName(name);
    return true;
  } catch {
    return false;
  }
};

const nodeAcceptsValue = (value: string): boolean => {
  try {
    validateHeaderValue('x', value);
    return true;
  } catch {
    return false;
  }
};

// Both checks, local and Node's, for one string: a disagreement names the string's code units.
const expectAgreement = (text: string) => {
  const units = [...text].map((c) => c.codePointAt(0)?.toString(16)).join(' ');
  expect(isHttpToken(text), `name [${units}]`).toBe(nodeAcceptsName(text));
  expect(isFieldValue(text), `value [${units}]`).toBe(nodeAcceptsValue(text));
};

// Every code point up to U+02FF (ASCII, Latin-1, the first code points past 0xFF), a few astral
// ones and the surrogates, each alone and inside otherwise valid text.
const singles = [
  ...Array.from({ length: 0x300 }, (_, i) => String.fromCharCode(i)),
  '\u2028',
  '\ufeff',
  '\uffff',
  '\ud800',
  '\udc00',
  '\u{1f600}',
  '\u{10000}',
  '\u{10ffff}',
];

// Strings from an alphabet biased toward the edges: tchar, the separators RFC 9110 keeps out of a
// token, whitespace, CR, LF, NUL, DEL, obs-text and code units over 0xFF.
const unit = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom(..."!#$%&'*+-.^_`|~09azAZ") },
  { weight: 2, arbitrary: fc.constantFrom(...'"(),/:;<=>?@[\\]{}') },
  { weight: 2, arbitrary: fc.constantFrom(' ', '\t', '\r', '\n', '\u0000', '\u000b', '\u001f', '\u007f') },
  { weight: 2, arbitrary: fc.integer({ min: 0x80, max: 0xff }).map((c) => String.fromCharCode(c)) },
  { weight: 1, arbitrary: fc.constantFrom('\u0100', '\u20ac', '\ud800', '\udc00', '\u{1f600}', '\ufffd') },
  { weight: 1, arbitrary: fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)) },
);

describe('isHttpToken and isFieldValue agree with Node on accept and refuse (property)', () => {
  it('on the empty string: no name, but a value', () => {
    expectAgreement('');
    expect(isHttpToken('')).toBe(false);
    expect(isFieldValue('')).toBe(true);
  });

  it('on every code point from U+0000 to U+02FF and some astral ones, alone and in valid text', () => {
    for (const c of singles) {
      expectAgreement(c);
      expectAgreement(`a${c}`);
      expectAgreement(`${c}a`);
      expectAgreement(`a${c}b`);
    }
  });

  it('accepts exactly the 77 tchar code points alone as a name and the 192 field-value ones alone as a value', () => {
    // A count that would catch a regex gone wide or narrow even if Node changed alongside it.
    const latin = Array.from({ length: 0x100 }, (_, i) => String.fromCharCode(i));
    expect(latin.filter(isHttpToken)).toHaveLength(26 + 26 + 10 + 15);
    expect(latin.filter(isFieldValue)).toHaveLength(1 + 95 + 128);
  });

  it('on random strings of tchar, separators, whitespace, controls, obs-text and wider code units', () => {
    fc.assert(
      fc.property(fc.string({ unit, maxLength: 12 }), (text) => expectAgreement(text)),
      {
        seed: 9110,
        numRuns: 5000,
      },
    );
  });

  it('on line breaks at the ends, where a regex without anchors or with the m flag would slip', () => {
    for (const text of ['a\n', '\na', 'a\r\n', 'a\nb', '\r', 'a\u2028', 'a\u0000']) expectAgreement(text);
  });
});
