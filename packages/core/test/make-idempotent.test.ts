// makeIdempotent: a message handler run once per key, over the engine and the memory store. The
// clock is injected; the same behaviour on Redis and PostgreSQL is docs/test/queues.audit.int.test.ts.
import { Buffer } from 'node:buffer';
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { IdempotencyOptions } from '../src/engine-options.js';
import { isIdempotencyError, StoreUnavailableError } from '../src/errors.js';
import { payloadFingerprint } from '../src/fingerprint.js';
import {
  type IdempotentRun,
  isReplayedFailure,
  type MakeIdempotentOptions,
  makeIdempotent,
} from '../src/make-idempotent.js';
import { memoryStore } from '../src/memory-store.js';
import { recordId } from '../src/record-id.js';
import type { Store } from '../src/store.js';

type Order = { id: string; amount: number };
const order = (id: string, amount = 5): Order => ({ id, amount });

function setup(options: Partial<IdempotencyOptions> = {}) {
  const clock = { now: 1_700_000_000_000 };
  const store = memoryStore({ now: () => clock.now });
  const engine = createIdempotency({ store, heartbeat: false, now: () => clock.now, ...options });
  const wrap = <R>(
    handler: (message: Order, run: IdempotentRun) => Promise<R>,
    extra: Partial<MakeIdempotentOptions<Order>> = {},
  ) =>
    makeIdempotent(handler, {
      engine,
      operation: 'processOrder',
      key: (message: Order) => message.id,
      payload: (message: Order) => JSON.stringify(message),
      ...extra,
    });
  return { clock, store, engine, wrap };
}

/** The error a promise rejects with (fails if it resolves). */
async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    (value) => {
      throw new Error(`expected a rejection, got ${String(value)}`);
    },
    (error: unknown) => error,
  );
}

// A store that counts claims: "nothing was claimed" is a count of 0.
function counting(store: Store): { store: Store; claims: () => number } {
  let claims = 0;
  return {
    store: {
      ...store,
      claim: (input) => {
        claims++;
        return store.claim(input);
      },
      renew: (input) => store.renew(input),
      complete: (input) => store.complete(input),
      release: (input) => store.release(input),
      get: (id) => store.get(id),
    },
    claims: () => claims,
  };
}

describe('makeIdempotent: one run per key', () => {
  it('the first delivery runs the handler; a redelivery gets its result without running it', async () => {
    const { wrap } = setup();
    let runs = 0;
    const handle = wrap(async (message) => {
      runs++;
      return { charged: message.amount };
    });
    expect(await handle(order('o-1'))).toEqual({ charged: 5 });
    expect(await handle(order('o-1'))).toEqual({ charged: 5 });
    expect(runs).toBe(1);
    // Another key runs again.
    expect(await handle(order('o-2', 7))).toEqual({ charged: 7 });
    expect(runs).toBe(2);
  });

  it('a handler that is not async: its value, typed as it returns it, and replayed', async () => {
    const { engine } = setup();
    let runs = 0;
    const handle = makeIdempotent(
      (m: Order) => {
        runs++;
        return { doubled: m.amount * 2 };
      },
      { engine, operation: 'sync', key: (m: Order) => m.id, payload: (m: Order) => JSON.stringify(m) },
    );
    const first: { doubled: number } = await handle(order('o-1'));
    expect(first).toEqual({ doubled: 10 });
    expect(await handle(order('o-1'))).toEqual({ doubled: 10 });
    expect(runs).toBe(1);
  });

  it('an async handler: the wrapper resolves to its value, not a promise of one (types)', async () => {
    const { wrap } = setup();
    const handle = wrap(async () => 42);
    const value: number = await handle(order('o-1'));
    expect(value).toBe(42);
  });

  it('the handler gets its lease: a signal not aborted, recovered false on a first run', async () => {
    const { wrap } = setup();
    let seen: { aborted: boolean; recovered: boolean } | undefined;
    const handle = wrap(async (_message, run) => {
      seen = { aborted: run.signal.aborted, recovered: run.recovered };
    });
    await handle(order('o-1'));
    expect(seen).toEqual({ aborted: false, recovered: false });
  });

  it('a crashed run: once its lease ended, the redelivery takes the key over with recovered true', async () => {
    const { wrap, clock } = setup();
    let started = 0;
    const dying = wrap(async () => {
      started++;
      return new Promise<never>(() => {}); // the process is gone
    });
    void dying(order('o-1'));
    await Promise.resolve();
    await Promise.resolve();
    expect(started).toBe(1);
    clock.now += 60_000; // past the 10 s lease, which nothing renews (heartbeat off)
    let recovered: boolean | undefined;
    const survivor = wrap(async (_message, run) => {
      recovered = run.recovered;
      return 'redone';
    });
    expect(await survivor(order('o-1'))).toBe('redone');
    expect(recovered).toBe(true);
  });

  it('a redelivery while the first runs: in_progress, retryable, retryAfter = conflictRetryAfter', async () => {
    const { wrap } = setup({ conflictRetryAfter: 3 });
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    let runs = 0;
    const handle = wrap(async () => {
      runs++;
      await gate;
      return 'done';
    });
    const running = handle(order('o-1'));
    const refused = await rejection(handle(order('o-1')));
    expect(isIdempotencyError(refused) && refused.code).toBe('in_progress');
    expect(isIdempotencyError(refused) && refused.retryable).toBe(true);
    expect(isIdempotencyError(refused) && refused.retryAfter).toBe(3);
    release();
    expect(await running).toBe('done');
    expect(await handle(order('o-1'))).toBe('done');
    expect(runs).toBe(1);
  });

  it('the same key with another payload: fingerprint_mismatch, not retryable; the handler does not run', async () => {
    const { wrap } = setup();
    let runs = 0;
    const handle = wrap(async () => {
      runs++;
      return 'ok';
    });
    await handle(order('o-1', 5));
    const refused = await rejection(handle(order('o-1', 7)));
    expect(isIdempotencyError(refused) && refused.code).toBe('fingerprint_mismatch');
    expect(isIdempotencyError(refused) && refused.retryable).toBe(false);
    expect(runs).toBe(1);
  });

  it('a text payload and the same bytes are one payload; the fingerprint is the SHA-256 of the bytes', async () => {
    const { store } = setup();
    type Raw = { id: string; body: string | Uint8Array };
    let runs = 0;
    const handle = makeIdempotent(
      async () => {
        runs++;
        return 'ok';
      },
      {
        engine: createIdempotency({ store }),
        operation: 'raw',
        key: (m: Raw) => m.id,
        payload: (m: Raw) => m.body,
      },
    );
    await handle({ id: 'r-1', body: '{"a":1}' });
    expect(await handle({ id: 'r-1', body: Buffer.from('{"a":1}') })).toBe('ok');
    expect(runs).toBe(1);
    // The digest a copy of the guide's wrapper stored: its records keep matching.
    const record = await store.get(recordId('', 'raw', 'r-1'));
    const expected = createHash('sha256').update('{"a":1}').digest('hex');
    expect(payloadFingerprint('{"a":1}')).toBe(expected);
    expect(record?.fingerprint).toBe(expected);
  });

  it('scope: the same key under two scopes is two records; the default is one scope, ""', async () => {
    const { store } = setup();
    const engine = createIdempotency({ store });
    type Sent = Order & { producer: string };
    let runs = 0;
    const scoped = makeIdempotent(
      async (m: Sent) => {
        runs++;
        return m.producer;
      },
      {
        engine,
        operation: 'op',
        key: (m: Sent) => m.id,
        payload: (m: Sent) => JSON.stringify(m),
        scope: (m: Sent) => m.producer,
      },
    );
    expect(await scoped({ id: 'k', amount: 1, producer: 'a' })).toBe('a');
    expect(await scoped({ id: 'k', amount: 1, producer: 'b' })).toBe('b');
    expect(runs).toBe(2);
    const unscoped = makeIdempotent(async () => 'x', {
      engine,
      operation: 'op2',
      key: (m: Order) => m.id,
      payload: (m: Order) => JSON.stringify(m),
    });
    await unscoped(order('k'));
    expect(await store.get(recordId('', 'op2', 'k'))).toBeDefined();
  });
});

describe('makeIdempotent: what a result becomes on a redelivery (the guide table)', () => {
  class Receipt {
    constructor(
      readonly id: string,
      readonly cents: number,
    ) {}
    get euros() {
      return this.cents / 100;
    }
  }
  const when = new Date('2026-01-02T03:04:05.678Z');
  const rows: Array<[string, () => unknown, unknown]> = [
    ['undefined', () => undefined, undefined],
    ['null', () => null, null],
    ['a string', () => 'text', 'text'],
    ['an empty string', () => '', ''],
    ['a number', () => 0, 0],
    ['a boolean', () => false, false],
    ['an array', () => [1, 'two', null], [1, 'two', null]],
    ['a plain object', () => ({ a: [1, { b: true }] }), { a: [1, { b: true }] }],
    ['a Date', () => when, when.toISOString()],
    ['a class instance', () => new Receipt('r1', 250), { id: 'r1', cents: 250 }],
    ['an object with toJSON', () => ({ toJSON: () => 'mine' }), 'mine'],
    ['a Map', () => new Map([['a', 1]]), {}],
    ['a Set', () => new Set([1]), {}],
    ['NaN', () => Number.NaN, null],
    ['Infinity inside an object', () => ({ rate: Number.POSITIVE_INFINITY }), { rate: null }],
    ['a Float32Array', () => new Float32Array([1.5, 2]), { 0: 1.5, 1: 2 }],
    ['a DataView', () => new DataView(new ArrayBuffer(2)), {}],
    ['an ArrayBuffer', () => new ArrayBuffer(2), {}],
  ];
  for (const [label, result, replay] of rows) {
    it(`${label}: the first run and a redelivery both get ${JSON.stringify(replay) ?? 'undefined'}`, async () => {
      const { wrap } = setup();
      let runs = 0;
      const handle = wrap(async () => {
        runs++;
        return result();
      });
      // toStrictEqual: a Receipt, a Map or a Float32Array is not the plain object both deliveries get.
      expect(await handle(order('o-1'))).toStrictEqual(replay);
      expect(await handle(order('o-1'))).toStrictEqual(replay);
      expect(runs).toBe(1);
    });
  }

  it('bytes (a Uint8Array or a Buffer): the first run and a redelivery get a Buffer copy of the same bytes', async () => {
    for (const bytes of [new Uint8Array([0xff, 0x00, 0x7f]), Buffer.from([1, 2, 3, 0])]) {
      const { wrap } = setup();
      const handle = wrap(async () => bytes);
      for (const delivered of [await handle(order('o-1')), await handle(order('o-1'))]) {
        expect(Buffer.isBuffer(delivered)).toBe(true);
        expect(delivered).not.toBe(bytes);
        expect(Buffer.compare(delivered, bytes)).toBe(0);
      }
    }
  });

  it('an empty Uint8Array stays bytes (not undefined)', async () => {
    const { wrap } = setup();
    const handle = wrap(async () => new Uint8Array());
    await handle(order('o-1'));
    const replayed = await handle(order('o-1'));
    expect(Buffer.isBuffer(replayed) && replayed.length).toBe(0);
  });

  const unstorable: Array<[string, () => unknown]> = [
    ['a BigInt', () => ({ cents: 5n })],
    [
      'a cycle',
      () => {
        const node: { self?: unknown } = {};
        node.self = node;
        return node;
      },
    ],
    ['a function', () => () => 1],
    ['a symbol', () => Symbol('s')],
    [
      'a toJSON that throws',
      () => ({
        toJSON() {
          throw new Error('no');
        },
      }),
    ],
    ['a result over maxResultBytes', () => 'x'.repeat(2 * 1024 * 1024)],
  ];
  for (const [label, result] of unstorable) {
    it(`${label}: response_not_replayable after the effect, under every preset; no second run`, async () => {
      for (const storeOutcome of ['all', 'stripe', 'success'] as const) {
        const { wrap } = setup({ storeOutcome });
        let runs = 0;
        const handle = wrap(async () => {
          runs++;
          return result();
        });
        const first = await rejection(handle(order('o-1')));
        expect(isIdempotencyError(first) && first.code, storeOutcome).toBe('response_not_replayable');
        expect(isIdempotencyError(first) && first.retryable, storeOutcome).toBe(false);
        expect((first as Error).cause, storeOutcome).toBeInstanceOf(Error);
        const again = await rejection(handle(order('o-1')));
        expect(isIdempotencyError(again) && again.code, storeOutcome).toBe('response_not_replayable');
        expect(runs, storeOutcome).toBe(1);
      }
    });
  }

  it('maxResultBytes counts as the stores do: a result at the limit is kept, one byte more is not', async () => {
    const { wrap } = setup();
    // The stored size of a JSON string result of n characters: 15 framing + headers + n + 2 quotes.
    const headers = Buffer.byteLength(JSON.stringify({ 'x-result': 'json' }));
    const limit = 15 + headers + 2 + 100;
    const fits = wrap(async () => 'x'.repeat(100), { maxResultBytes: limit });
    await fits(order('o-1'));
    expect(await fits(order('o-1'))).toBe('x'.repeat(100));
    const over = wrap(async () => 'x'.repeat(101), { maxResultBytes: limit });
    const refused = await rejection(over(order('o-2')));
    expect(isIdempotencyError(refused) && refused.code).toBe('response_not_replayable');
  });
});

describe('makeIdempotent: a thrown handler', () => {
  it("under 'stripe' (and 'success'): the key is released, the redelivery runs again", async () => {
    for (const storeOutcome of ['stripe', 'success'] as const) {
      const { wrap } = setup({ storeOutcome });
      let runs = 0;
      const failure = new Error('database down');
      const handle = wrap(async () => {
        runs++;
        if (runs === 1) throw failure;
        return 'ok';
      });
      // The handler's own error, the same object.
      expect(await rejection(handle(order('o-1')))).toBe(failure);
      expect(await handle(order('o-1'))).toBe('ok');
      expect(runs).toBe(2);
    }
  });

  it("under 'all': the failure is kept; a redelivery gets an Error with its name and message, without running", async () => {
    const { wrap } = setup({ storeOutcome: 'all' });
    let runs = 0;
    const handle = wrap(async () => {
      runs++;
      throw new RangeError('card declined');
    });
    const first = await rejection(handle(order('o-1')));
    expect(first).toBeInstanceOf(RangeError);
    const replayed = await rejection(handle(order('o-1')));
    expect(replayed).toBeInstanceOf(Error);
    expect((replayed as Error).name).toBe('RangeError');
    expect((replayed as Error).message).toBe('card declined');
    expect(runs).toBe(1);
  });

  it("under 'all': a replayed failure says so (replayed: true), so a consumer can tell it from a new one; the first run's error is the handler's own", async () => {
    const { wrap } = setup({ storeOutcome: 'all' });
    const handle = wrap(async () => {
      throw new TypeError('bad order');
    });
    const first = await rejection(handle(order('o-1')));
    expect((first as { replayed?: unknown }).replayed).toBeUndefined();
    const replayed = await rejection(handle(order('o-1')));
    expect(isReplayedFailure(replayed)).toBe(true);
    expect((replayed as { replayed?: unknown }).replayed).toBe(true);
    expect(isReplayedFailure(first)).toBe(false);
    expect(isReplayedFailure(new Error('x'))).toBe(false);
    expect(isReplayedFailure(Object.assign(new Error('x'), { replayed: 'yes' }))).toBe(false);
    expect(isReplayedFailure(null)).toBe(false);
  });

  it("under 'all': a thrown non-Error (a string, null) is kept as an Error with its text", async () => {
    for (const [thrown, message] of [
      ['plain text', 'plain text'],
      [null, 'null'],
      [{ name: 42, message: 'odd' }, 'odd'],
    ] as const) {
      const { wrap } = setup({ storeOutcome: 'all' });
      const handle = wrap(async () => {
        throw thrown;
      });
      expect(await rejection(handle(order('o-1')))).toBe(thrown);
      const replayed = await rejection(handle(order('o-1')));
      expect((replayed as Error).name).toBe('Error');
      expect((replayed as Error).message).toBe(message);
    }
  });

  it('a handler that throws synchronously (not async) is treated the same', async () => {
    const { engine } = setup({ storeOutcome: 'stripe' });
    let runs = 0;
    const handle = makeIdempotent(
      () => {
        runs++;
        if (runs === 1) throw new Error('sync');
        return 'ok';
      },
      { engine, operation: 'sync', key: (m: Order) => m.id, payload: (m: Order) => JSON.stringify(m) },
    );
    await expect(handle(order('o-1'))).rejects.toThrow('sync');
    expect(await handle(order('o-1'))).toBe('ok');
  });
});

describe('makeIdempotent: a message it cannot describe is refused before any claim', () => {
  const cases: Array<[string, Partial<MakeIdempotentOptions<Order>>, (error: unknown) => void]> = [
    [
      'key() gives undefined',
      { key: () => undefined as unknown as string },
      (e) => expect(isIdempotencyError(e) && e.code).toBe('key_missing'),
    ],
    ['key() gives ""', { key: () => '' }, (e) => expect(isIdempotencyError(e) && e.code).toBe('key_missing')],
    [
      'key() gives a number',
      { key: () => 42 as unknown as string },
      (e) => expect(isIdempotencyError(e) && e.code).toBe('key_invalid'),
    ],
    [
      'key() throws',
      {
        key: () => {
          throw new TypeError("Cannot read properties of undefined (reading 'id')");
        },
      },
      (e) => {
        expect(isIdempotencyError(e) && e.code).toBe('key_invalid');
        expect((e as Error).cause).toBeInstanceOf(TypeError);
      },
    ],
    [
      'scope() gives undefined',
      { scope: () => undefined as unknown as string },
      (e) => expect(isIdempotencyError(e) && e.code).toBe('scope_missing'),
    ],
    [
      'scope() throws',
      {
        scope: () => {
          throw new Error('no producer');
        },
      },
      (e) => expect(isIdempotencyError(e) && e.code).toBe('scope_missing'),
    ],
    [
      'payload() gives undefined (JSON.stringify of undefined)',
      { payload: () => undefined as unknown as string },
      (e) => {
        expect(e).toBeInstanceOf(TypeError);
        expect((e as Error).message).toMatch(/payload function must give a string or a Uint8Array/);
      },
    ],
    [
      'payload() gives an object',
      { payload: (m) => m as unknown as string },
      (e) => expect(e).toBeInstanceOf(TypeError),
    ],
    [
      'payload() gives a string with a lone surrogate',
      { payload: () => 'a\ud800b' },
      (e) => {
        expect(e).toBeInstanceOf(TypeError);
        expect((e as Error).message).toMatch(/lone surrogate/);
      },
    ],
    [
      'payload() throws',
      {
        payload: () => {
          throw new Error('bad');
        },
      },
      (e) => {
        expect(e).toBeInstanceOf(TypeError);
        expect((e as Error).message).toMatch(/payload function threw/);
        expect(((e as Error).cause as Error).message).toBe('bad');
      },
    ],
  ];
  for (const [label, options, check] of cases) {
    it(`${label}: refused, nothing claimed, the handler not run`, async () => {
      const counted = counting(memoryStore());
      const engine = createIdempotency({ store: counted.store });
      let runs = 0;
      const handle = makeIdempotent(
        async () => {
          runs++;
          return 'ran';
        },
        {
          engine,
          operation: 'processOrder',
          key: (m: Order) => m.id,
          payload: (m: Order) => JSON.stringify(m),
          ...options,
        },
      );
      const error = await rejection(handle(order('o-1')));
      check(error);
      if (isIdempotencyError(error)) expect(error.retryable).toBe(false);
      expect(counted.claims()).toBe(0);
      expect(runs).toBe(0);
    });
  }
});

describe('makeIdempotent: options are checked once, when it is made', () => {
  const { engine } = setup();
  const good: MakeIdempotentOptions<Order> = {
    engine,
    operation: 'processOrder',
    key: (m) => m.id,
    payload: (m) => JSON.stringify(m),
  };
  const handler = async () => 'x';
  const refused: Array<[string, unknown, RegExp]> = [
    ['no options', undefined, /options object/],
    ['no engine', { ...good, engine: undefined }, /engine/],
    ['an engine that is a store', { ...good, engine: memoryStore() }, /engine/],
    ['no operation', { ...good, operation: undefined }, /operation/],
    ['an empty operation', { ...good, operation: '' }, /operation/],
    ['key not a function', { ...good, key: 'id' }, /key must be a function/],
    ['payload not a function', { ...good, payload: undefined }, /payload must be a function/],
    ['scope not a function', { ...good, scope: 'tenant' }, /scope must be a function/],
    ['maxResultBytes 0', { ...good, maxResultBytes: 0 }, /maxResultBytes/],
    ['maxResultBytes 1.5', { ...good, maxResultBytes: 1.5 }, /maxResultBytes/],
    ['maxResultBytes as text', { ...good, maxResultBytes: '1mb' }, /maxResultBytes/],
    ['maxResultBytes Infinity', { ...good, maxResultBytes: Number.POSITIVE_INFINITY }, /maxResultBytes/],
    [
      'a misspelt option',
      { ...good, maxResultByte: 10 },
      /unknown option "maxResultByte" \(did you mean "maxResultBytes"\?\)/,
    ],
    ['a Powertools option', { ...good, persistenceStore: {} }, /unknown option "persistenceStore"/],
  ];
  for (const [label, options, message] of refused) {
    it(`${label}: a TypeError naming it`, () => {
      expect(() => makeIdempotent(handler, options as MakeIdempotentOptions<Order>)).toThrow(TypeError);
      expect(() => makeIdempotent(handler, options as MakeIdempotentOptions<Order>)).toThrow(message);
    });
  }

  it('a handler that is no function: a TypeError', () => {
    expect(() => makeIdempotent('charge' as never, good)).toThrow(/handler function/);
  });

  it('scope and maxResultBytes may be left out, or given as undefined', () => {
    expect(typeof makeIdempotent(handler, good)).toBe('function');
    expect(typeof makeIdempotent(handler, { ...good, scope: undefined, maxResultBytes: undefined } as never)).toBe(
      'function',
    );
  });

  it('the options are read once: changing the object afterwards changes nothing', async () => {
    const { engine: own } = setup();
    const options: MakeIdempotentOptions<Order> = { ...good, engine: own };
    const handle = makeIdempotent(async () => 'first', options);
    options.key = () => {
      throw new Error('read late');
    };
    expect(await handle(order('o-1'))).toBe('first');
  });
});

describe('makeIdempotent: storeUnavailable, when the store cannot be reached at claim time (anchors case 14)', () => {
  // A store whose claim fails as a network store's does when it is down (connection refused, a timeout).
  // What a store that cannot be reached rejects with (Redis and PostgreSQL wrap the socket's error so).
  const down = () =>
    new StoreUnavailableError('Redis claim failed', { cause: new Error('connect ECONNREFUSED (injected)') });

  function downAtClaim(store: Store) {
    const state = { down: true, claims: 0, completes: 0 };
    const wrapped: Store = {
      ...counting(store).store,
      claim: (input) => {
        state.claims++;
        if (state.down) return Promise.reject(down());
        return store.claim(input);
      },
      complete: (input) => {
        state.completes++;
        return store.complete(input);
      },
    };
    return { store: wrapped, state };
  }

  it('fail-closed (the default): store_unavailable, the handler never runs', async () => {
    const { store: inner } = setup();
    const { store } = downAtClaim(inner);
    const { wrap } = setup({ store });
    let runs = 0;
    for (const storeUnavailable of [undefined, 'fail-closed'] as const) {
      const handle = wrap(async () => ++runs, storeUnavailable === undefined ? {} : { storeUnavailable });
      const error = await rejection(handle(order('o-1')));
      expect(isIdempotencyError(error) && error.code).toBe('store_unavailable');
    }
    expect(runs).toBe(0);
  });

  it('fail-open: each delivery runs the handler once, unprotected; nothing is stored, and the event says so', async () => {
    const events: unknown[] = [];
    const { store: inner } = setup();
    const { store, state } = downAtClaim(inner);
    const { wrap } = setup({ store, onEvent: (event) => events.push(event) });
    let runs = 0;
    let seen: IdempotentRun | undefined;
    const handle = wrap(
      async (_message, run) => {
        seen = run;
        return { run: ++runs, at: new Date(0) };
      },
      { storeUnavailable: 'fail-open' },
    );
    // What every delivery returns is still the stored form of the result (a Date is its string).
    expect(await handle(order('o-1'))).toEqual({ run: 1, at: '1970-01-01T00:00:00.000Z' });
    expect(seen?.recovered).toBe(false);
    expect(seen?.signal.aborted).toBe(false);
    expect(await handle(order('o-1'))).toEqual({ run: 2, at: '1970-01-01T00:00:00.000Z' });
    expect(state.completes).toBe(0);
    expect(events).toMatchObject([
      { type: 'store-error', phase: 'claim', unprotected: true },
      { type: 'store-error', phase: 'claim', unprotected: true },
    ]);
    // Once the store is back: the key was never recorded, so it runs once more, then is replayed.
    state.down = false;
    expect(await handle(order('o-1'))).toMatchObject({ run: 3 });
    expect(await handle(order('o-1'))).toMatchObject({ run: 3 });
    expect(runs).toBe(3);
  });

  it('fail-open: a handler that throws, unprotected, throws its own error and leaves nothing behind', async () => {
    const { store: inner } = setup();
    const { store, state } = downAtClaim(inner);
    const { wrap } = setup({ store });
    const boom = new Error('declined');
    const handle = wrap(
      async () => {
        throw boom;
      },
      { storeUnavailable: 'fail-open' },
    );
    expect(await rejection(handle(order('o-1')))).toBe(boom);
    expect(state.completes).toBe(0);
  });

  // Decided: maxResultBytes exists because a result must be stored to be replayed. An unprotected
  // run stores nothing, so the cap does not apply: its result is returned, whatever its size (a
  // protected run over the cap throws response_not_replayable after the effect, and keeps the key).
  // A result JSON cannot write has no value of its stored form to return (its type is `never`): it
  // throws response_not_replayable either way.
  it('fail-open: a result over maxResultBytes is returned, unprotected, as nothing is stored', async () => {
    const { store: inner } = setup();
    const { store, state } = downAtClaim(inner);
    const { wrap } = setup({ store });
    const big = 'x'.repeat(1000);
    const handle = wrap(async () => ({ big }), { storeUnavailable: 'fail-open', maxResultBytes: 100 });
    expect(await handle(order('o-1'))).toEqual({ big });
    expect(state.completes).toBe(0);
    // The same result, protected, is refused: the cap is about what is stored.
    state.down = false;
    const refused = await rejection(handle(order('o-1')));
    expect(isIdempotencyError(refused) && refused.code).toBe('response_not_replayable');
    state.down = true;
    let runs = 0;
    const bigint = wrap(async () => ({ cents: BigInt(++runs) }), { storeUnavailable: 'fail-open' });
    const thrown = await rejection(bigint(order('o-2')));
    expect(isIdempotencyError(thrown) && thrown.code).toBe('response_not_replayable');
    expect(isIdempotencyError(thrown) && thrown.retryable).toBe(false);
    await rejection(bigint(order('o-2')));
    expect(runs).toBe(2);
  });

  it('fail-open: a store that answers is never bypassed; a key in progress is still in_progress', async () => {
    const { wrap } = setup();
    let release: () => void = () => undefined;
    const handle = wrap(() => new Promise<string>((resolve) => (release = () => resolve('done'))), {
      storeUnavailable: 'fail-open',
    });
    const first = handle(order('o-1'));
    await new Promise((resolve) => setImmediate(resolve));
    const error = await rejection(handle(order('o-1')));
    expect(isIdempotencyError(error) && error.code).toBe('in_progress');
    release();
    expect(await first).toBe('done');
  });

  it('fail-open: a waiter that saw the key in progress never runs unprotected when its next claim fails', async () => {
    // The first claim finds the record held by another consumer; the wait then sees it gone; the
    // claim after that cannot reach the store. The record was live a moment ago: failing open here
    // could run the handler beside the first consumer.
    const { store: inner } = setup();
    const holder = setup({ store: inner });
    const held = await holder.engine.begin({
      key: 'o-1',
      scope: '',
      operation: 'processOrder',
      fingerprint: payloadFingerprint(JSON.stringify(order('o-1'))),
    });
    expect(held.kind).toBe('execute');
    let claims = 0;
    const store: Store = {
      ...counting(inner).store,
      claim: (input) => (++claims === 1 ? inner.claim(input) : Promise.reject(down())),
      get: async () => undefined,
    };
    const { wrap } = setup({ store, wait: '5s' });
    let runs = 0;
    const handle = wrap(async () => ++runs, { storeUnavailable: 'fail-open' });
    const error = await rejection(handle(order('o-1')));
    expect(isIdempotencyError(error) && error.code).toBe('store_unavailable');
    expect(claims).toBe(2);
    expect(runs).toBe(0);
  });

  it('fail-open: a delivery of a key this process is running never runs unprotected when the store goes down', async () => {
    // A store behind a network (not in process), so the engine looks at its own leases first; in wait
    // mode it then asks the store, which is down. The first delivery still runs: failing open here
    // would run the handler a second time beside it.
    const { store: inner } = setup();
    const state = { down: false };
    const { inProcess: _inProcess, ...remote } = inner as Store & { inProcess?: boolean };
    const store: Store = {
      ...remote,
      claim: (input) => (state.down ? Promise.reject(down()) : Promise.resolve(inner.claim(input))),
    };
    const { wrap } = setup({ store, wait: '5s' });
    let runs = 0;
    let finish: () => void = () => undefined;
    const handle = wrap(
      () =>
        new Promise<number>((resolve) => {
          // A second run (the defect) answers at once, so the test fails on its result, not a timeout.
          if (++runs > 1) resolve(runs);
          finish = () => resolve(runs);
        }),
      { storeUnavailable: 'fail-open' },
    );
    const first = handle(order('o-1'));
    await new Promise((resolve) => setImmediate(resolve));
    expect(runs).toBe(1);
    state.down = true;
    const error = await rejection(handle(order('o-1')));
    expect(isIdempotencyError(error) && error.code).toBe('store_unavailable');
    expect(runs).toBe(1);
    finish();
    expect(await first).toBe(1);
  });

  // Decided: fail-open gives no protection while the store cannot be reached, not a partial one. Two
  // deliveries of one key in this process both run, as two in two processes would, and as a retry
  // after the first did: an in-process note of unprotected runs would stop only the first of these,
  // and would make the outage look safer than it is. The guides say so.
  it('fail-open: a second delivery of a key this process is running unprotected runs too (no protection at all)', async () => {
    const { store: inner } = setup();
    const { inProcess: _inProcess, ...remote } = inner as Store & { inProcess?: boolean };
    const store: Store = { ...remote, claim: () => Promise.reject(down()) };
    const { wrap } = setup({ store });
    let runs = 0;
    const finishes: (() => void)[] = [];
    const handle = wrap(
      () =>
        new Promise<number>((resolve) => {
          const run = ++runs;
          finishes.push(() => resolve(run));
        }),
      { storeUnavailable: 'fail-open' },
    );
    const first = handle(order('o-1'));
    await new Promise((resolve) => setImmediate(resolve));
    expect(runs).toBe(1);
    const second = handle(order('o-1'));
    await new Promise((resolve) => setImmediate(resolve));
    expect(runs).toBe(2);
    for (const finish of finishes) finish();
    expect([await first, await second]).toEqual([1, 2]);
  });

  it('an unknown value: a TypeError naming the option', () => {
    const { wrap } = setup();
    // A BigInt and an object without a prototype too: naming the value must not throw a TypeError of its own.
    for (const value of ['open', true, null, 1n, Symbol('open'), Object.create(null)]) {
      expect(() => wrap(async () => 1, { storeUnavailable: value as never }), typeof value).toThrow(
        /storeUnavailable must be 'fail-closed' or 'fail-open'/,
      );
    }
  });
});

describe("makeIdempotent: a result the store's own cap refuses", () => {
  it('a result within maxResultBytes but over the store cap is kept as unreplayable, never run again', async () => {
    // Was wrong: the store refused the completion (ResponseTooLargeError) and the engine freed the
    // key, so the redelivery ran the effect again. The engine now says the store's cap
    // (settings.storeMaxResponseBytes) and makeIdempotent keeps to it, as the HTTP adapters do.
    const clock = { now: 1_700_000_000_000 };
    const store = memoryStore({ maxBytes: 4096, now: () => clock.now });
    const engine = createIdempotency({ store, heartbeat: false, now: () => clock.now });
    let runs = 0;
    const handle = makeIdempotent(
      async () => {
        runs++;
        return 'x'.repeat(8000); // under the default maxResultBytes (1 MiB), over the store's 4 KiB
      },
      { engine, operation: 'processOrder', key: (m: Order) => m.id, payload: (m: Order) => JSON.stringify(m) },
    );
    expect(engine.settings.storeMaxResponseBytes).toBe(4096);
    await expect(handle(order('o-1'))).rejects.toMatchObject({ code: 'response_not_replayable' });
    await expect(handle(order('o-1'))).rejects.toMatchObject({ code: 'response_not_replayable' });
    expect(runs).toBe(1);
  });
});

describe('makeIdempotent: nested operations on one engine (Powertools #5707)', () => {
  // Powertools completed a nested operation under the outer one's key prefix. Here each wrapped
  // function keeps its own record, whichever of them runs inside the other, under one key.
  it('an inner operation called by an outer one, under the same key, is stored and replayed under its own', async () => {
    const { wrap } = setup();
    const runs = { outer: 0, inner: 0 };
    const charge = wrap(
      async (message) => {
        runs.inner++;
        return { charged: message.amount, by: 'inner' };
      },
      { operation: 'chargeCard' },
    );
    const process = wrap(async (message) => {
      runs.outer++;
      const charged = await charge(message);
      return { processed: message.id, charged, by: 'outer' };
    });
    const first = await process(order('o-1', 7));
    expect(first).toEqual({ processed: 'o-1', charged: { charged: 7, by: 'inner' }, by: 'outer' });
    // The outer one replays its own result; the inner one, called alone, replays its own, not the outer's.
    expect(await process(order('o-1', 7))).toEqual(first);
    expect(await charge(order('o-1', 7))).toEqual({ charged: 7, by: 'inner' });
    expect(runs).toEqual({ outer: 1, inner: 1 });
  });
});
