/**
 * A Set that refuses every change once built: a principal's scope and roles. The verified-token cache
 * hands one principal to every request with that token, so a handler's `scope.add('x')` would grant
 * `x` to the next request. It stays a real Set for everything else (`instanceof Set`, iteration, the
 * ES2025 set methods, which return ordinary sets).
 *
 * @example
 * const scope = new ReadonlyStringSet(['orders:read']);
 * scope.has('orders:read'); // true
 * scope.add('orders:write'); // TypeError
 */
export class ReadonlyStringSet extends Set<string> {
  constructor(values: Iterable<string>) {
    // Set's constructor would call our add; the values go in through Set's own.
    super();
    for (const value of values) super.add(value);
    Object.freeze(this);
  }

  override add(_value: string): this {
    throw refused();
  }

  override delete(_value: string): boolean {
    throw refused();
  }

  override clear(): void {
    throw refused();
  }
}

const refused = () => new TypeError("a principal's scope and roles are read-only: copy them to change them");
