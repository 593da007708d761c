import { describe, expect, it } from 'vitest';
import { foldRoutePath, normalisePercentEncoding, type RoutePathOptions } from '../src/route-path.js';

const loose: RoutePathOptions = {};
const caseSensitive: RoutePathOptions = { caseSensitive: true };
const strict: RoutePathOptions = { strict: true };
const both: RoutePathOptions = { caseSensitive: true, strict: true };

// path, options, the operation's path: one row per way a router can fold a spelling.
const table: [string, RoutePathOptions, string][] = [
  ['/charges', loose, '/charges'],
  ['/charges/', loose, '/charges'],
  ['/CHARGES', loose, '/charges'],
  ['/Charges/', loose, '/charges'],
  ['/charges/ch_A', loose, '/charges/ch_a'],
  // One slash dropped, as the routers make one trailing slash optional, not two.
  ['/charges//', loose, '/charges/'],
  // The root keeps its slash.
  ['/', loose, '/'],
  ['/', both, '/'],
  ['', loose, ''],
  ['/Charges/', caseSensitive, '/Charges'],
  ['/Charges', caseSensitive, '/Charges'],
  ['/Charges/', strict, '/charges/'],
  ['/CHARGES', strict, '/charges'],
  ['/Charges/', both, '/Charges/'],
  ['/Charges', both, '/Charges'],
  // Escapes of what is not an unreserved character stay escapes, and other scripts fold as the string does.
  ['/Caf%C3%A9/', loose, '/caf%c3%a9'],
  ['/Caf%c3%a9', caseSensitive, '/Caf%C3%A9'],
  ['/ÉTÉ/', loose, '/été'],
  // An escaped unreserved character is the character (RFC 3986 6.2.2.2): one operation, one key.
  ['/evt%5F1', loose, '/evt_1'],
  ['/evt%5f1', both, '/evt_1'],
  ['/%41%7a', caseSensitive, '/Az'],
  ['/%7E%2D%2E%30%39', both, '/~-.09'],
  // Reserved and other characters stay escaped, upper case: '%2F' is not '/', '%25' is not '%'.
  ['/a%2fb', both, '/a%2Fb'],
  ['/%25%34%31', both, '/%2541'],
  ['/%40%3a%20', both, '/%40%3A%20'],
  // What is no escape is left as it is.
  ['/%zz%4', both, '/%zz%4'],
  ['/100%', both, '/100%'],
];

describe('foldRoutePath', () => {
  it.each(table)('%j with %j is %j', (path, options, folded) => {
    expect(foldRoutePath(path, options)).toBe(folded);
  });

  it('folds as Express and @koa/router compare by default: every spelling of one route is one path', () => {
    const spellings = ['/charges', '/charges/', '/CHARGES', '/Charges/'];
    expect(new Set(spellings.map((path) => foldRoutePath(path, {})))).toEqual(new Set(['/charges']));
    expect(new Set(spellings.map((path) => foldRoutePath(path, both))).size).toBe(spellings.length);
  });
});

describe('normalisePercentEncoding', () => {
  it('decodes exactly the unreserved characters and upper-cases every other escape', () => {
    for (let code = 0; code < 256; code++) {
      const hex = code.toString(16).padStart(2, '0');
      const unreserved = /^[A-Za-z0-9\-._~]$/.test(String.fromCharCode(code));
      const expected = unreserved ? String.fromCharCode(code) : `%${hex.toUpperCase()}`;
      expect(normalisePercentEncoding(`/%${hex}`)).toBe(`/${expected}`);
      expect(normalisePercentEncoding(`/%${hex.toUpperCase()}`)).toBe(`/${expected}`);
    }
  });

  it('returns a path without escapes as it is', () => {
    const path = '/charges/ch_1';
    expect(normalisePercentEncoding(path)).toBe(path);
  });
});
