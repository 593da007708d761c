// Read-only views of a Set, for a principal's scope and roles. The set itself lives only in this map,
// never on the view, so nothing reachable from a principal can change it: `Set.prototype.add.call(view,
// x)` throws too, because the view is no Set. The methods are shared by every view: a view costs one
// frozen object, made once per principal.
const viewed = new WeakMap<object, Set<string>>();

function setOf(view: object): Set<string> {
  const set = viewed.get(view);
  if (set === undefined) throw new TypeError('not a read-only set of a principal');
  return set;
}

// The ES2025 set methods (`union`, `isSubsetOf`, ...) read their argument through `size`, `has` and
// `keys`, which the view has, and return new, ordinary sets; they are delegated where the runtime has them.
const es2025SetMethods = [
  'union',
  'intersection',
  'difference',
  'symmetricDifference',
  'isSubsetOf',
  'isSupersetOf',
  'isDisjointFrom',
] as const;

const readonlySetPrototype: object = Object.freeze(
  Object.defineProperties(
    {},
    {
      size: {
        get(this: object) {
          return setOf(this).size;
        },
      },
      has: {
        value(this: object, value: string) {
          return setOf(this).has(value);
        },
      },
      forEach: {
        value(
          this: ReadonlySet<string>,
          callback: (value: string, key: string, set: ReadonlySet<string>) => void,
          thisArg?: unknown,
        ) {
          for (const value of setOf(this)) callback.call(thisArg, value, value, this);
        },
      },
      entries: {
        value(this: object) {
          return setOf(this).entries();
        },
      },
      keys: {
        value(this: object) {
          return setOf(this).keys();
        },
      },
      values: {
        value(this: object) {
          return setOf(this).values();
        },
      },
      [Symbol.iterator]: {
        value(this: object) {
          return setOf(this).values();
        },
      },
      [Symbol.toStringTag]: { value: 'ReadonlySet' },
      ...Object.fromEntries(
        es2025SetMethods
          .filter((name) => typeof (Set.prototype as unknown as Record<string, unknown>)[name] === 'function')
          .map((name) => [
            name,
            {
              value(this: object, other: unknown) {
                const method = (Set.prototype as unknown as Record<string, (other: unknown) => unknown>)[name];
                return method?.call(setOf(this), other);
              },
            },
          ]),
      ),
    },
  ),
);

/**
 * A read-only view of `values`: `has`, `size`, iteration, `forEach`, `entries`/`keys`/`values` and the
 * ES2025 set methods, but no `add`, `delete` or `clear`. The caller hands the set over: it must not
 * keep changing it, since the view reads it live.
 *
 * @example
 * const scope = readonlySet(new Set(['orders:read']));
 * scope.has('orders:read'); // true
 */
export function readonlySet(values: Set<string>): ReadonlySet<string> {
  const view = Object.freeze(Object.create(readonlySetPrototype) as object);
  viewed.set(view, values);
  return view as ReadonlySet<string>;
}
