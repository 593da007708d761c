/**
 * A Set whose `add`, `delete` and `clear` throw once built: a principal's scope and roles. The
 * verified-token cache hands one principal to every request with that token, so a handler's
 * `scope.add('x')` would grant `x` to the next request. It stays a real Set for everything else
 * (`instanceof Set`, iteration, the ES2025 set methods, which return ordinary sets). Set's own
 * methods called on it (`Set.prototype.add.call`) still reach its contents: it guards against
 * mistakes, not against code set on changing it.
 *
 * @example
 * const scope = readonlyStringSet(['orders:read']);
 * scope.has('orders:read'); // true
 * (scope as Set<string>).add('orders:write'); // TypeError (the type has no `add`; a cast does not help)
 */
export function readonlyStringSet(values: Iterable<string>): ReadonlySet<string> {
  const set = new Set(values);
  set.add = refuse;
  set.delete = refuse;
  set.clear = refuse;
  return Object.freeze(set);
}

function refuse(): never {
  throw new TypeError("a principal's scope and roles are read-only: copy them to change them");
}
