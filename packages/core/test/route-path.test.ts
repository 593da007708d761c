import { describe, expect, it } from 'vitest';
import { foldRoutePath, type RoutePathOptions } from '../src/route-path.js';

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
  // Percent-escapes and other scripts fold as the string does; nothing is decoded.
  ['/Caf%C3%A9/', loose, '/caf%c3%a9'],
  ['/ÉTÉ/', loose, '/été'],
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
