// The declared result type of makeIdempotent's wrapper, against what a redelivery returns.
import { describe, expect, expectTypeOf, it } from 'vitest';
import { createIdempotency, makeIdempotent, memoryStore } from '../src/index.js';

type Order = { id: string };
const options = () => ({
  engine: createIdempotency({ store: memoryStore() }),
  operation: 'stampOrder',
  key: (order: Order) => order.id,
  payload: (order: Order) => JSON.stringify(order),
});

describe('makeIdempotent: the type of a redelivered result', () => {
  // Was wrong: the wrapper is declared `(message: M) => Promise<R>` for a handler returning R, but only
  // the first run returns the handler's own value; a redelivery returns what JSON made of it
  // (docs/guides/queues.md, "What a result becomes on a redelivery"): a Date comes back as its ISO
  // string, a class instance as a plain object without its methods or getters, a Map or Set as `{}`.
  // So `(await stamp(order)).getTime()` compiles, works on the first delivery, and throws a TypeError
  // on the redelivery, the path that is rarely tested. The types give the user no warning; needs a
  // decision:
  //   1. type the result as it may come back: `Promise<R | Replayed<R>>` (Replayed maps Date to
  //      string, Map and Set to `{}`, a class to its own data fields, functions away), which is the
  //      truth but shows every caller a union for Date-bearing results;
  //   2. accept only results that come back as they went (`R extends Replayable`: JSON values,
  //      `Uint8Array`, `undefined`), so a Date, Map or class instance is a compile error and the user
  //      converts it (`toISOString()`) in the handler; this breaks code that compiles today;
  //   3. return the JSON round trip on the first run too (every delivery sees the same value) and
  //      type it `Promise<Replayed<R>>`: one behaviour, honest types, but a change of the documented
  //      first-run behaviour (the handler's own value) and a copy per call.
  it.fails('a Date result is still a Date when it is replayed, as its declared type says', async () => {
    const stamp = makeIdempotent(async (_order: Order) => new Date('2026-01-02T03:04:05.678Z'), options());
    const first = await stamp({ id: 'o-1' });
    const redelivered = await stamp({ id: 'o-1' });
    // What the types promise, both times (checked by the repository's typecheck):
    expectTypeOf(redelivered).toEqualTypeOf<Date>();
    expect(first).toBeInstanceOf(Date);
    // What the redelivery gets: '2026-01-02T03:04:05.678Z', a string.
    expect(redelivered).toBeInstanceOf(Date);
  });
});
