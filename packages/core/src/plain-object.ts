/**
 * True for a plain object: an object literal or `JSON.parse` result, of this realm or another (a
 * node:vm context's, a sandboxed parser's), or a null-prototype object (`Object.create(null)`).
 * Another realm's `Object.prototype` is known by what it is: no prototype of its own, and an own
 * `constructor` that is a function named `Object` whose own `prototype` is it, all read as data
 * properties (an accessor would run the caller's code). An array, a `Map`, a `Date`, a `Headers`, a
 * class instance (of any realm), or an object over a plain object (its members may be inherited,
 * where `Object.keys` does not look) is not one.
 *
 * @example
 * isPlainObject(JSON.parse('{"a":1}')); // true
 * isPlainObject(new Map()); // false
 */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null) return false;
  const prototype: unknown = Object.getPrototypeOf(value);
  if (prototype === Object.prototype || prototype === null) return true;
  if (typeof prototype !== 'object' || prototype === null || Object.getPrototypeOf(prototype) !== null) return false;
  const maker: unknown = Object.getOwnPropertyDescriptor(prototype, 'constructor')?.value;
  if (typeof maker !== 'function' || Object.getOwnPropertyDescriptor(maker, 'name')?.value !== 'Object') return false;
  return Object.getOwnPropertyDescriptor(maker, 'prototype')?.value === prototype;
}
