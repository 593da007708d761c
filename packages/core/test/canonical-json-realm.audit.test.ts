// Was wrong: canonicalJson took only this realm's Object.prototype (or none), so plain JSON data
// made in another realm (a node:vm context: a sandboxed parser or handler, a test environment's
// globals) had "no canonical form": the public canonicalJson gave undefined, jsonBodyText fell back to
// the members in insertion order, and a parsed body nested deeper than JSON.stringify recurses, which
// this realm's objects fingerprint without a stack overflow, threw a RangeError out of
// fingerprintRequest (a 500 for a body that is well-formed JSON). Another realm's Object.prototype is
// known by what it is (no prototype of its own; an own `constructor` named `Object` whose `prototype`
// is it), the rule @idem/webhooks took for headers; Map, Date, class instances and objects over a
// plain object, of any realm, are still no JSON data.
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { canonicalJson } from '../src/canonical-json.js';
import { fingerprintRequest, jsonBodyText } from '../src/fingerprint.js';
import { isPlainObject } from '../src/index.js';

const otherRealm = (source: string): unknown => runInNewContext(source);

const fingerprintOf = (json: unknown) =>
  fingerprintRequest({ method: 'POST', route: '/charges', path: '/charges', contentType: 'application/json', json });

describe('plain JSON data made in another realm', () => {
  it('canonicalJson writes it as this realm’s, members sorted at every level', () => {
    const value = otherRealm('({ b: 1, a: { d: [1, { z: 2, y: null }], c: "x" }, e: Object.create(null) })');
    expect(Object.getPrototypeOf(value)).not.toBe(Object.prototype);
    const expected = '{"a":{"c":"x","d":[1,{"y":null,"z":2}]},"b":1,"e":{}}';
    expect(canonicalJson(value)).toBe(expected);
    expect(jsonBodyText(value)).toBe(expected);
    expect(fingerprintOf(value)).toBe(fingerprintOf(JSON.parse(expected)));
  });

  it('a body nested past the stack fingerprints as this realm’s does, with no RangeError', () => {
    const depth = 20_000;
    const text = `${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`;
    const value = otherRealm(`JSON.parse(${JSON.stringify(text)})`);
    expect(() => JSON.stringify(value)).toThrow(RangeError);
    expect(jsonBodyText(value)).toBe(text);
    expect(fingerprintOf(value)).toBe(fingerprintOf(JSON.parse(text)));
  });

  it.each([
    ['a Map', 'new Map([["a", 1]])'],
    ['a Date', 'new Date(0)'],
    ['a class instance', 'new (class Thing { constructor() { this.a = 1; } })()'],
    ['a class named Object', 'new (class Object { constructor() { this.a = 1; } })()'],
    ['an object over a plain object', 'Object.create({ a: 1 })'],
    ['an array', '[1]'],
  ])('%s of another realm is still no plain object (an array is JSON data of its own kind)', (_name, source) => {
    const value = otherRealm(source);
    expect(isPlainObject(value)).toBe(false);
    if (!Array.isArray(value)) expect(canonicalJson({ v: value })).toBeUndefined();
  });

  it('isPlainObject: literals, JSON.parse results and null-prototype objects of any realm; nothing else', () => {
    for (const value of [
      {},
      JSON.parse('{"a":1}'),
      Object.create(null),
      otherRealm('({})'),
      otherRealm('Object.create(null)'),
    ])
      expect(isPlainObject(value)).toBe(true);
    for (const value of [null, undefined, 1, 'a', [], new Map(), new Date(0), Object.create({}), new (class {})()])
      expect(isPlainObject(value)).toBe(false);
    // A prototype whose `constructor` is an accessor is not read through it (no caller code runs).
    const sneaky = Object.create(null) as object;
    let ran = false;
    Object.defineProperty(sneaky, 'constructor', {
      get() {
        ran = true;
        return Object;
      },
    });
    expect(isPlainObject(Object.create(sneaky))).toBe(false);
    expect(ran).toBe(false);
  });
});
