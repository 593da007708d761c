// What makeIdempotent's wrapper returns, on the first delivery and on a redelivery. Its declared type
// (`Replayed<R>`) is checked in make-idempotent-result-type.types.test.ts.
import { Buffer } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import { createIdempotency, makeIdempotent, memoryStore } from '../src/index.js';

type Order = { id: string };

// A handler returning `value` once per key, and the number of times it ran.
function wrapped<R>(value: () => R) {
  let runs = 0;
  const handle = makeIdempotent(
    async (_order: Order) => {
      runs++;
      return value();
    },
    {
      engine: createIdempotency({ store: memoryStore() }),
      operation: 'stampOrder',
      key: (order: Order) => order.id,
      payload: (order: Order) => JSON.stringify(order),
    },
  );
  return { handle, runs: () => runs };
}

class Receipt {
  constructor(
    readonly id: string,
    readonly cents: number,
  ) {}
  get euros() {
    return this.cents / 100;
  }
  describe() {
    return `${this.id}: ${this.euros} EUR`;
  }
}

const when = new Date('2026-01-02T03:04:05.678Z');

describe('makeIdempotent: the first delivery returns what a redelivery gets', () => {
  // Was wrong: the wrapper was declared `(message: M) => Promise<R>`, and the first run returned the
  // handler's own value, but a redelivery returned what JSON made of it: a Date came back as its ISO
  // string, a class instance as a plain object, a Map as `{}`. `(await stamp(order)).getTime()`
  // compiled, worked on the first delivery and threw a TypeError on the redelivery, the path that
  // is rarely tested. Now every delivery, the first included, returns the stored copy (typed
  // `Replayed<R>`), so the path a test takes is the path a redelivery takes.
  const rows: Array<[string, () => unknown, unknown]> = [
    ['a Date', () => when, '2026-01-02T03:04:05.678Z'],
    ['a Map', () => new Map([['a', 1]]), {}],
    ['a Set', () => new Set([1]), {}],
    ['a class instance with a method and a getter', () => new Receipt('r1', 250), { id: 'r1', cents: 250 }],
    [
      'Dates nested in arrays',
      () => ({ at: [when, [when]], gone: undefined, fn: () => 1 }),
      { at: ['2026-01-02T03:04:05.678Z', ['2026-01-02T03:04:05.678Z']] },
    ],
    ['undefined and a function inside an array', () => [undefined, () => 1, 2], [null, null, 2]],
    ['NaN', () => Number.NaN, null],
    ['Infinity inside an object', () => ({ rate: Number.POSITIVE_INFINITY }), { rate: null }],
    ['undefined', () => undefined, undefined],
  ];
  for (const [label, value, stored] of rows) {
    it(`${label}: the first run and a redelivery both get ${JSON.stringify(stored) ?? 'undefined'}`, async () => {
      const { handle, runs } = wrapped(value);
      const first = await handle({ id: 'o-1' });
      const redelivered = await handle({ id: 'o-1' });
      expect(runs()).toBe(1);
      // toStrictEqual compares prototypes too: a Receipt is not the plain object a redelivery gets.
      expect(first).toStrictEqual(stored);
      expect(redelivered).toStrictEqual(first);
    });
  }

  it('bytes: the first run gets a Buffer copy of its bytes, as a redelivery does', async () => {
    const own = new Uint8Array([0xff, 0x00, 0x7f]);
    const { handle } = wrapped(() => own);
    const first = await handle({ id: 'o-1' });
    const redelivered = await handle({ id: 'o-1' });
    expect(Buffer.isBuffer(first)).toBe(true);
    expect(first).not.toBe(own);
    expect(first).toStrictEqual(redelivered);
    expect([...first]).toEqual([0xff, 0x00, 0x7f]);
  });

  it('the first result is a copy: changing it changes neither the handler’s value nor a redelivery', async () => {
    const own = { at: [when] };
    const { handle } = wrapped(() => own);
    const first = await handle({ id: 'o-1' });
    first.at.push('changed');
    expect(own.at).toEqual([when]);
    expect(await handle({ id: 'o-1' })).toStrictEqual({ at: ['2026-01-02T03:04:05.678Z'] });
  });
});

describe('makeIdempotent: a non-finite number result', () => {
  // Was an open question: `Replayed<number>` is `number`, but `NaN`, `Infinity` and `-Infinity`
  // (alone or inside a value) come back `null`, as JSON writes them, so a caller that does
  // `(await measure(m)).toFixed(2)` compiles and throws on a NaN. The choices were: every number
  // typed `number | null` (every numeric result, `{ charged: number }` included, turns nullable and
  // code that compiles today stops compiling); a non-finite number refused as unstorable (a result
  // that worked fails after its effect, and the encoder walks every value to find one); or both
  // kept and said. Decided: kept and said (the type's TSDoc and docs/guides/queues.md's table), as
  // type-fest's `Jsonify` does for `number`. What holds, and is pinned here: the first delivery gets
  // the `null` every redelivery gets, never a NaN once and a null after.
  it('a non-finite number comes back null on every delivery, the first included, alone or inside a value', async () => {
    for (const value of [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]) {
      const alone = wrapped((): number => value);
      expect(await alone.handle({ id: 'o-1' })).toBeNull();
      expect(await alone.handle({ id: 'o-1' })).toBeNull();
      expect(alone.runs()).toBe(1);
      const inside = wrapped(() => ({ rate: value, rates: [1, value] }));
      expect(await inside.handle({ id: 'o-1' })).toStrictEqual({ rate: null, rates: [1, null] });
      expect(await inside.handle({ id: 'o-1' })).toStrictEqual({ rate: null, rates: [1, null] });
    }
  });
});
