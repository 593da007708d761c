/**
 * Every string and byte sequence (as latin1 text) reachable from `value` through its own properties,
 * enumerable or not: an error's `cause` is not enumerable, and its driver's fields (`command`,
 * `params`) are. That is what a logger's error serialiser or `util.inspect` walks, so a value that
 * must never reach a log (a response body, a token, a password) must not be in it. Stacks are left
 * out: they hold code locations, not data.
 *
 * @example
 * const event = storeErrors[0];
 * expect(reachableText(event).join('\n')).not.toContain('4111111111111111');
 */
export function reachableText(value: unknown, seen: Set<unknown> = new Set()): string[] {
  if (typeof value === 'string') return [value];
  if (value instanceof Uint8Array) return [Buffer.from(value).toString('latin1')];
  if (value === null || typeof value !== 'object' || seen.has(value)) return [];
  seen.add(value);
  return Reflect.ownKeys(value).flatMap((key) =>
    key === 'stack' ? [] : reachableText((value as Record<PropertyKey, unknown>)[key], seen),
  );
}
