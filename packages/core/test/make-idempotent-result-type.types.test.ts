// The declared result of makeIdempotent's wrapper, `Replayed<R>`: what JSON (or, for bytes and
// `undefined`, the wrapper's own encoding) makes of a handler's R. The type-level lines are checked
// by `npm run typecheck` (tsc); the runtime lines, run by vitest, keep each type next to the value a
// delivery really gets.
import { Buffer } from 'node:buffer';
import { describe, expect, expectTypeOf, it } from 'vitest';
import { createIdempotency, makeIdempotent, memoryStore, type Replayed } from '../src/index.js';

type Order = { id: string };

function wrap<R>(handler: (order: Order) => Promise<R>) {
  return makeIdempotent(handler, {
    engine: createIdempotency({ store: memoryStore() }),
    operation: 'op',
    key: (order: Order) => order.id,
    payload: (order: Order) => JSON.stringify(order),
  });
}

class Receipt {
  constructor(
    readonly id: string,
    readonly cents: number,
  ) {}
  describe() {
    return `${this.id}: ${this.cents}`;
  }
}

describe('Replayed<R>', () => {
  it('the wrapper is typed with it, and its value matches on the first delivery and a redelivery', async () => {
    const stamp = wrap(async () => new Date('2026-01-02T03:04:05.678Z'));
    expectTypeOf(stamp).toEqualTypeOf<(message: Order) => Promise<string>>();
    const first = await stamp({ id: 'o-1' });
    const again = await stamp({ id: 'o-1' });
    expectTypeOf(first).toEqualTypeOf<string>();
    expect(first).toBe('2026-01-02T03:04:05.678Z');
    expect(again).toBe(first);
  });

  it('JSON values keep their type, literals included', () => {
    expectTypeOf<Replayed<string>>().toEqualTypeOf<string>();
    expectTypeOf<Replayed<'ok'>>().toEqualTypeOf<'ok'>();
    expectTypeOf<Replayed<number>>().toEqualTypeOf<number>();
    expectTypeOf<Replayed<boolean>>().toEqualTypeOf<boolean>();
    expectTypeOf<Replayed<null>>().toEqualTypeOf<null>();
    expectTypeOf<Replayed<{ a: number[]; b: { c: string | null } }>>().toEqualTypeOf<{
      a: number[];
      b: { c: string | null };
    }>();
  });

  it('undefined stays undefined, void stays void (nothing is stored but the kind)', async () => {
    expectTypeOf<Replayed<undefined>>().toEqualTypeOf<undefined>();
    expectTypeOf<Replayed<void>>().toEqualTypeOf<void>();
    expectTypeOf<Replayed<string | undefined>>().toEqualTypeOf<string | undefined>();
    const act = wrap(async () => {});
    expectTypeOf(act).returns.resolves.toEqualTypeOf<void>();
    expect(await act({ id: 'o-1' })).toBeUndefined();
  });

  it('a Date, and any object with toJSON, is what its toJSON gives, replayed in turn', async () => {
    expectTypeOf<Replayed<Date>>().toEqualTypeOf<string>();
    expectTypeOf<Replayed<{ toJSON(): { at: Date } }>>().toEqualTypeOf<{ at: string }>();
    const shaped = wrap(async () => ({ toJSON: () => ({ at: new Date(0) }) }));
    expectTypeOf(await shaped({ id: 'o-1' })).toEqualTypeOf<{ at: string }>();
    expect(await shaped({ id: 'o-1' })).toEqual({ at: '1970-01-01T00:00:00.000Z' });
  });

  it('a Map, Set, WeakMap or WeakSet is an empty record', async () => {
    expectTypeOf<Replayed<Map<string, number>>>().toEqualTypeOf<Record<string, never>>();
    expectTypeOf<Replayed<Set<number>>>().toEqualTypeOf<Record<string, never>>();
    expectTypeOf<Replayed<WeakMap<object, number>>>().toEqualTypeOf<Record<string, never>>();
    expectTypeOf<Replayed<WeakSet<object>>>().toEqualTypeOf<Record<string, never>>();
    const mapped = wrap(async () => new Map([['a', 1]]));
    expect(await mapped({ id: 'o-1' })).toStrictEqual({});
  });

  it('a class instance is its data fields: methods are dropped, readonly is gone from the copy', async () => {
    expectTypeOf<Replayed<Receipt>>().toEqualTypeOf<{ id: string; cents: number }>();
    const receipt = wrap(async () => new Receipt('r1', 250));
    const value = await receipt({ id: 'o-1' });
    expectTypeOf(value).not.toHaveProperty('describe');
    expect(value).toStrictEqual({ id: 'r1', cents: 250 });
  });

  it('in an object, function, symbol and undefined properties are dropped; maybe-undefined ones are optional', () => {
    type Shape = {
      at: Date;
      count: number;
      gone: undefined;
      run: () => void;
      tag: symbol;
      [Symbol.iterator]: number;
      maybe?: Date;
      either: string | undefined;
      callableOrText: string | (() => string);
    };
    expectTypeOf<Replayed<Shape>>().toEqualTypeOf<{
      at: string;
      count: number;
      maybe?: string;
      either?: string;
      callableOrText?: string;
    }>();
    expectTypeOf<Replayed<Record<string, Date>>>().toEqualTypeOf<Record<string, string>>();
  });

  it('in an array, undefined, a function or a symbol is null; tuples stay tuples', async () => {
    expectTypeOf<Replayed<Array<Date | undefined>>>().toEqualTypeOf<Array<string | null>>();
    expectTypeOf<Replayed<readonly Date[]>>().toEqualTypeOf<string[]>();
    expectTypeOf<Replayed<[Date, undefined, () => void, number]>>().toEqualTypeOf<[string, null, null, number]>();
    expectTypeOf<Replayed<{ at: Date[][] }>>().toEqualTypeOf<{ at: string[][] }>();
    const listed = wrap(async () => [new Date(0), undefined] as [Date, undefined]);
    const value = await listed({ id: 'o-1' });
    expectTypeOf(value).toEqualTypeOf<[string, null]>();
    expect(value).toStrictEqual(['1970-01-01T00:00:00.000Z', null]);
  });

  it('bytes (a Uint8Array or a Buffer) come back as a Buffer; nested, they are JSON like other typed arrays', async () => {
    expectTypeOf<Replayed<Uint8Array>>().toEqualTypeOf<Buffer<ArrayBuffer>>();
    expectTypeOf<Replayed<Buffer>>().toEqualTypeOf<Buffer<ArrayBuffer>>();
    expectTypeOf<Replayed<Float32Array>>().toEqualTypeOf<Record<string, number>>();
    expectTypeOf<Replayed<{ raw: Uint8Array }>>().toEqualTypeOf<{ raw: Record<string, number> }>();
    expectTypeOf<Replayed<{ raw: Buffer }>>().toEqualTypeOf<{ raw: { type: 'Buffer'; data: number[] } }>();
    expectTypeOf<Replayed<ArrayBuffer>>().toEqualTypeOf<Record<string, never>>();
    expectTypeOf<Replayed<DataView>>().toEqualTypeOf<Record<string, never>>();
    const bytes = wrap(async () => new Uint8Array([1, 2]));
    const value = await bytes({ id: 'o-1' });
    expect(Buffer.isBuffer(value)).toBe(true);
    const nested = wrap(async () => ({ raw: Buffer.from([1, 2]), view: new Uint8Array([3]) }));
    expect(await nested({ id: 'o-1' })).toStrictEqual({ raw: { type: 'Buffer', data: [1, 2] }, view: { 0: 3 } });
  });

  it('what JSON.stringify refuses or drops at the top (a BigInt, a function, a symbol) is never: such a run throws', () => {
    expectTypeOf<Replayed<bigint>>().toEqualTypeOf<never>();
    expectTypeOf<Replayed<() => void>>().toEqualTypeOf<never>();
    expectTypeOf<Replayed<symbol>>().toEqualTypeOf<never>();
    expectTypeOf<Replayed<BigInt64Array>>().toEqualTypeOf<never>();
    expectTypeOf<Replayed<{ cents: bigint }>>().toEqualTypeOf<{ cents: never }>();
  });

  it('any and unknown stay as they are', () => {
    expectTypeOf<Replayed<any>>().toBeAny();
    expectTypeOf<Replayed<unknown>>().toBeUnknown();
  });
});
