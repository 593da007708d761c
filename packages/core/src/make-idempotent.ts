import { Buffer } from 'node:buffer';
import type { IdempotencyEngine } from './engine-types.js';
import { IdempotencyError } from './errors.js';
import { payloadFingerprint } from './fingerprint.js';
import { assertKnownOptions, type ListsEvery } from './option-names.js';
import type { StoredResponse } from './store.js';
import { checkStoreUnavailable, type StoreUnavailablePolicy } from './store-unavailable.js';
import { storedResponseSize } from './stored-response.js';

/**
 * How a message maps to its idempotency record, for {@link makeIdempotent}.
 *
 * @example
 * const options: MakeIdempotentOptions<{ id: string; amount: number }> = {
 *   engine,
 *   operation: 'processOrder',
 *   key: (order) => order.id,
 *   payload: (order) => JSON.stringify(order),
 * };
 */
export interface MakeIdempotentOptions<M> {
  /** One engine per process; every consumer of the queue gives it the same shared store. */
  engine: IdempotencyEngine;
  /** Names the handler: part of the record id, so a key never crosses two handlers. */
  operation: string;
  /**
   * The key: the message id, or a business id in the payload (Powertools' `eventKeyJmesPath`).
   * No key (`undefined`, `null`, `''`) is `key_missing`; another type, or a throw, `key_invalid`.
   */
  key: (message: M) => string;
  /**
   * What every delivery under the key must carry, as text (its UTF-8) or bytes: another payload is
   * refused, `fingerprint_mismatch`. Only its SHA-256 is stored.
   */
  payload: (message: M) => string | Uint8Array;
  /**
   * Whose keys these are, when two producers' keys could collide. Default: one scope, `''`, for
   * every message (a key then means the same whoever sent it). Not a string, or a throw: `scope_missing`.
   */
  scope?: ((message: M) => string) | undefined;
  /**
   * A larger result is not kept (the first run and its redeliveries get `response_not_replayable`).
   * Measured as stores measure a response (see `storedResponseSize`), and never above the store's own
   * cap (`maxResponseBytes`, 4 MiB by default on Redis and PostgreSQL), whatever is set. Default 1 MiB.
   * The result is measured after the handler ran, so a larger one has had its effect: the key is kept
   * as unreplayable and the handler is not run again. An unprotected run (`storeUnavailable:
   * 'fail-open'`) stores nothing, so no cap applies to it: its result is returned whatever its size.
   */
  maxResultBytes?: number | undefined;
  /**
   * When the store cannot be reached to claim the key (a `StoreUnavailableError`, or `storeTimeout`;
   * any other error fails closed): `'fail-closed'` (default) throws
   * `store_unavailable`, for the consumer to redeliver later; `'fail-open'` runs the handler
   * unprotected, stores nothing, and returns (or throws) what it did, so every delivery until the
   * store is back runs it, and the first one after it too. The engine's `store-error` event says
   * `unprotected: true`. See {@link StoreUnavailablePolicy}.
   */
  storeUnavailable?: StoreUnavailablePolicy | undefined;
}

/**
 * What the wrapped handler is given besides its message: its lease's signal, and whether it took a
 * crashed run's key over.
 *
 * @example
 * const handler = async (order: { id: string }, run: IdempotentRun) => {
 *   if (run.recovered) await lookForAnEarlierCharge(order.id); // a crashed run may have charged
 *   run.signal.throwIfAborted(); // the lease is lost: stop before the effect
 *   return chargeCard(order);
 * };
 */
export interface IdempotentRun {
  /** Aborts with `lease_lost` when the lease is lost: stop before the effect. */
  signal: AbortSignal;
  /** True when this run took the key over from a run whose lease ran out (it may have done part of the work). */
  recovered: boolean;
}

/**
 * What a handler's result `R` is once it has been stored and read back: the value every delivery
 * under a key gets from {@link makeIdempotent}, the first included. At the top, `undefined` (and
 * `void`) stays so, and bytes (a `Uint8Array` or `Buffer`) come back as a `Buffer` copy; everything
 * else is what `JSON.parse(JSON.stringify(value))` makes of it:
 *
 * - a `Date`, or any object with `toJSON()`, is what its `toJSON()` returns (a `Date`: its ISO string);
 * - a `Map`, `Set`, `WeakMap`, `WeakSet`, `ArrayBuffer` or `DataView` is an empty record, and another
 *   typed array (or a `Uint8Array` inside a value) a record of its elements by index;
 * - a class instance is a plain object of its data fields: methods are dropped (so are getters at
 *   run time, which TypeScript cannot tell from fields: a getter is still typed as a field);
 * - in an object, properties that are functions, symbols or `undefined` are dropped, and one that
 *   may be any of them is optional; symbol keys are dropped;
 * - in an array, `undefined`, a function or a symbol is `null`;
 * - a `BigInt` (or a `BigInt64Array`), and at the top a function or a symbol, is `never`: no such
 *   result can be stored, and its run throws `response_not_replayable`.
 *
 * A `number` stays `number`, though `NaN` and `±Infinity` come back `null`: the type cannot tell
 * them apart from other numbers.
 *
 * @example
 * const stamp = makeIdempotent(async (order: { id: string }) => ({ id: order.id, at: new Date() }), options);
 * const { at } = await stamp(order); // Replayed<{ id: string; at: Date }>: `at` is a string
 */
export type Replayed<R> = 0 extends 1 & R
  ? R // any
  : unknown extends R
    ? R // unknown
    : R extends void
      ? R // undefined, or a handler that returns nothing
      : R extends Uint8Array
        ? ReplayedBytes
        : Json<R>;

// What decode() gives for bytes, a Buffer of its own memory: `Buffer<ArrayBuffer>` where @types/node
// makes Buffer generic (TypeScript 5.7 on), plain `Buffer` for an older compiler, where writing
// `Buffer<ArrayBuffer>` would not compile. Buffer.alloc's return type is each of those in turn.
type ReplayedBytes = ReturnType<typeof Buffer.alloc>;

// What JSON makes of a value that is kept (the top, an array item, a kept property).
type Json<T> = 0 extends 1 & T
  ? T
  : unknown extends T
    ? T
    : T extends Dropped | bigint | BigInt64Array | BigUint64Array
      ? never // dropped, or JSON.stringify throws
      : T extends string | number | boolean | null
        ? T
        : T extends { toJSON(...args: never[]): infer J }
          ? Json<J>
          : T extends Map<unknown, unknown> | Set<unknown> | WeakMap<object, unknown> | WeakSet<object>
            ? Record<string, never>
            : T extends ArrayBuffer | SharedArrayBuffer | DataView
              ? Record<string, never>
              : T extends NumberArray
                ? Record<string, number>
                : T extends readonly unknown[]
                  ? { -readonly [I in keyof T]: Item<T[I]> }
                  : T extends object
                    ? Fields<T>
                    : never;

// JSON.stringify leaves these out of an object and writes them as null in an array.
type Dropped = undefined | symbol | ((...args: any[]) => unknown);

type NumberArray =
  | Int8Array
  | Uint8Array
  | Uint8ClampedArray
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | Float32Array
  | Float64Array;

type Item<T> = T extends Dropped ? null : Json<T>;

// Properties that are always kept, then those that may be dropped (as optional), flattened into one
// object type so that it reads (and compares) as the object a caller gets.
type Fields<T> = Flat<
  {
    -readonly [K in keyof T as K extends symbol ? never : [Extract<T[K], Dropped>] extends [never] ? K : never]: Json<
      T[K]
    >;
  } & {
    -readonly [K in keyof T as K extends symbol
      ? never
      : [Extract<T[K], Dropped>] extends [never]
        ? never
        : [Exclude<T[K], Dropped>] extends [never]
          ? never
          : K]?: Json<Exclude<T[K], Dropped>>;
  }
>;

type Flat<T> = { [K in keyof T]: T[K] };

/** Every name {@link MakeIdempotentOptions} has; the type check below keeps the list complete. */
const makeIdempotentOptionNames = [
  'engine',
  'operation',
  'key',
  'payload',
  'scope',
  'maxResultBytes',
  'storeUnavailable',
] as const satisfies readonly (keyof MakeIdempotentOptions<unknown>)[];
const everyOptionNamed: ListsEvery<MakeIdempotentOptions<unknown>, typeof makeIdempotentOptionNames> = true;
void everyOptionNamed;
const knownOptions: ReadonlySet<string> = new Set(makeIdempotentOptionNames);

const defaultMaxResultBytes = 1024 * 1024;

// The engine keeps an HTTP-shaped outcome (status, headers, bytes); this header says what its bytes
// hold, so a replay gives back the kind of value the first run returned.
const kind = 'x-result';

/**
 * Wraps a message handler (a queue consumer's: SQS, RabbitMQ, NATS JetStream) so that it runs once
 * per key, whichever consumer gets which delivery: the first delivery runs it and stores its result;
 * every other delivery under the key gets that result without running it. Every delivery, the first
 * included, returns the stored copy ({@link Replayed}): what JSON makes of the result (a `Date` is
 * its ISO string, a class instance a plain object of its fields, a `Map` `{}`), bytes as a `Buffer`
 * copy, `undefined` as it is, so the first delivery and a redelivery are deep-equal. The engine's refusals are
 * thrown as `IdempotencyError` (match on `code`; `retryable` and `retryAfter` say whether and when
 * to redeliver): `in_progress` while the first run goes on, `fingerprint_mismatch` for another
 * payload under the key, `store_unavailable`. A result that cannot be stored (not JSON, over
 * `maxResultBytes`) throws `response_not_replayable` after the effect, and the key is kept: the
 * handler is never run again for it. A thrown handler is stored or released as the engine's
 * `storeOutcome` says (`'stripe'` or `'success'` release it, as Powertools does; `'all'` keeps it).
 * Options are checked here, once: a `TypeError` names the wrong one.
 *
 * @example
 * const processOrder = makeIdempotent(async (order: { id: string; amount: number }) => chargeCard(order), {
 *   engine: createIdempotency({ store, storeOutcome: 'stripe', wait: '15s' }),
 *   operation: 'processOrder',
 *   key: (order) => order.id,
 *   payload: (order) => JSON.stringify(order),
 * });
 * await processOrder({ id: 'order-1', amount: 5 }); // runs chargeCard; a redelivery gets the same copy of its result
 */
export function makeIdempotent<M, R>(
  handler: (message: M, run: IdempotentRun) => R | PromiseLike<R>,
  options: MakeIdempotentOptions<M>,
): (message: M) => Promise<Replayed<R>> {
  if (typeof handler !== 'function') throw new TypeError('makeIdempotent needs a handler function');
  if (!options || typeof options !== 'object') throw new TypeError('makeIdempotent needs an options object');
  assertKnownOptions(options, knownOptions, 'makeIdempotent');
  // Read once: an options object changed later changes nothing, as for every other factory of core.
  const { engine, operation, key, payload, scope } = options;
  if (!engine || typeof engine.begin !== 'function' || typeof engine.complete !== 'function') {
    throw new TypeError('makeIdempotent: engine must be an engine made by createIdempotency()');
  }
  if (typeof operation !== 'string' || operation.length === 0) {
    throw new TypeError('makeIdempotent: operation must be a non-empty string');
  }
  if (typeof key !== 'function') throw new TypeError('makeIdempotent: key must be a function of the message');
  if (typeof payload !== 'function') throw new TypeError('makeIdempotent: payload must be a function of the message');
  if (scope !== undefined && typeof scope !== 'function') {
    throw new TypeError('makeIdempotent: scope must be a function of the message, or left out');
  }
  const asked = options.maxResultBytes ?? defaultMaxResultBytes;
  if (!Number.isSafeInteger(asked) || asked < 1) {
    throw new TypeError('makeIdempotent: maxResultBytes must be a positive integer');
  }
  // Never above the store's own cap: a result it refuses would release the key after the effect,
  // and the redelivery would run the handler again. Over the smaller cap, the key is kept as
  // unreplayable instead.
  const storeCap = engine.settings?.storeMaxResponseBytes;
  const maxResultBytes = storeCap === undefined ? asked : Math.min(asked, storeCap);
  const storeUnavailable = checkStoreUnavailable(options.storeUnavailable, 'makeIdempotent: storeUnavailable');

  return async (message) => {
    // All three are read before the claim: a message they cannot describe is refused with nothing
    // claimed, so no key is left in progress by a consumer that never ran the handler.
    const started = await engine.begin({
      key: keyOf(key, message),
      scope: scope === undefined ? '' : scopeOf(scope, message),
      operation,
      fingerprint: fingerprintOf(payload, message),
      storeUnavailable,
    });
    if (started.kind === 'reject') throw started.error; // in_progress, fingerprint_mismatch, store_unavailable
    if (started.kind === 'replay') return decode(started.response) as Replayed<R>;
    if (started.kind === 'unprotected') {
      // Nothing holds the key: no lease to lose, nothing to store. The result is still given back as
      // a stored one would be, so a caller sees the same value whichever way the delivery ran.
      const result = await handler(message, { signal: unprotectedSignal, recovered: false });
      return copyOf(result) as Replayed<R>;
    }
    const { lease } = started;
    let result: R;
    try {
      // `signal` is read through: the engine makes a lease's AbortController on first use only, and
      // most handlers never look at it.
      const run: IdempotentRun = {
        get signal() {
          return lease.signal;
        },
        recovered: lease.recovered,
      };
      result = await handler(message, run);
    } catch (error) {
      // The engine's storeOutcome decides: 'stripe' or 'success' release the key (the redelivery
      // runs again, as in Powertools), 'all' keeps the failure (the redelivery gets it, replayed).
      await engine.complete(lease, failureResponse(error), { thrown: true });
      throw error;
    }
    // The handler's effect happened: from here on the key must never be released, or a redelivery
    // would make it again. A result that cannot be kept is stored as such, under any preset (its
    // outcome is judged as the success it was, status 200).
    let response: StoredResponse | undefined;
    let cause: unknown;
    try {
      response = encode(result);
      const bytes = storedResponseSize(response);
      if (bytes > maxResultBytes) throw new RangeError(`the result is ${bytes} bytes, over ${maxResultBytes}`);
    } catch (error) {
      cause = error;
      response = undefined;
    }
    if (response === undefined) {
      await engine.complete(
        lease,
        { status: 500, headers: { [kind]: 'unstorable' }, body: new Uint8Array() },
        { status: 200 },
      );
      throw unstorable(cause);
    }
    // The first run returns what every redelivery will get, decoded by the replay path's own
    // function, so a caller meets a Date turned string (or a Map turned {}) on the delivery it tests,
    // not first on a redelivery. Decoded before completing: the value never shares a buffer with the
    // store's copy.
    const stored = decode(response) as Replayed<R>;
    // Not stored (the lease was lost to another consumer, or the store failed even after the
    // engine's retries) changes nothing here: the effect is done, so this delivery is done.
    await engine.complete(lease, response);
    return stored;
  };
}

// The key of a message, or the refusal a message without one gets. An IdempotencyError, not a
// TypeError: the message is at fault, not the code, and a consumer dead-letters a non-retryable one.
function keyOf<M>(key: (message: M) => string, message: M): string {
  let value: unknown;
  try {
    value = key(message);
  } catch (cause) {
    throw new IdempotencyError('key_invalid', 'The key function threw for this message; nothing was claimed.', {
      cause,
    });
  }
  if (value === undefined || value === null || value === '') {
    throw new IdempotencyError('key_missing', 'The key function gave no key for this message; nothing was claimed.');
  }
  if (typeof value !== 'string') {
    throw new IdempotencyError(
      'key_invalid',
      `The key function gave a ${typeof value}, not a string, for this message; nothing was claimed.`,
    );
  }
  return value;
}

function scopeOf<M>(scope: (message: M) => string, message: M): string {
  let value: unknown;
  try {
    value = scope(message);
  } catch (cause) {
    throw new IdempotencyError('scope_missing', 'The scope function threw for this message; nothing was claimed.', {
      cause,
    });
  }
  if (typeof value !== 'string') {
    throw new IdempotencyError(
      'scope_missing',
      `The scope function gave a ${value === null ? 'null' : typeof value}, not a string, for this message; nothing was claimed.`,
    );
  }
  return value;
}

// A payload that is no text or bytes is the payload function's bug (what it hashes would depend on
// how Node coerces it), so a TypeError, as for bad options; one that throws is passed on in one.
function fingerprintOf<M>(payload: (message: M) => string | Uint8Array, message: M): string {
  let value: unknown;
  try {
    value = payload(message);
  } catch (cause) {
    throw new TypeError('makeIdempotent: the payload function threw for this message; nothing was claimed', { cause });
  }
  if (typeof value === 'string') {
    // A lone surrogate has no UTF-8 form: hashed as U+FFFD, two payloads would match that differ.
    // (JSON.stringify never makes one; only a string cut or built by hand can hold one.)
    if (!(value as WellFormedCheck).isWellFormed()) {
      throw new TypeError(
        'makeIdempotent: the payload function gave a string with a lone surrogate, which has no UTF-8 form; give its bytes',
      );
    }
    return payloadFingerprint(value);
  }
  if (value instanceof Uint8Array) return payloadFingerprint(value);
  throw new TypeError(
    `makeIdempotent: the payload function must give a string or a Uint8Array, not ${value === null ? 'null' : typeof value}; nothing was claimed`,
  );
}

// String.prototype.isWellFormed (ES2024, Node 20+), which the ES2023 library types do not declare.
type WellFormedCheck = string & { isWellFormed(): boolean };

function encode(result: unknown): StoredResponse {
  if (result === undefined) return { status: 200, headers: { [kind]: 'undefined' }, body: new Uint8Array() };
  // A copy: the handler's own buffer goes back to its caller, who may refill it (a pooled buffer)
  // while a completion that failed is tried again in the background, after this call returned.
  if (result instanceof Uint8Array) return { status: 200, headers: { [kind]: 'bytes' }, body: Uint8Array.from(result) };
  const text = JSON.stringify(result); // throws on a BigInt or a cycle
  if (text === undefined) throw new TypeError(`a ${typeof result} result is not JSON`);
  return { status: 200, headers: { [kind]: 'json' }, body: Buffer.from(text) };
}

// What a thrown handler leaves: its error's name and message (never its stack or fields, which may
// hold what the store must not keep), replayed under 'all' as an Error with the same two.
function failureResponse(error: unknown): StoredResponse {
  const thrown = error as { name?: unknown; message?: unknown } | null | undefined;
  let failure: { name: string; message: string };
  try {
    failure = {
      name: typeof thrown?.name === 'string' ? thrown.name : 'Error',
      message: String(thrown?.message ?? error),
    };
  } catch {
    // A getter that throws, or a value String() refuses (a symbol, a null-prototype object).
    failure = { name: 'Error', message: 'the handler threw a value that has no message' };
  }
  return { status: 500, headers: { [kind]: 'error' }, body: Buffer.from(JSON.stringify(failure)) };
}

// Marks the Error a replayed failure is thrown as. A registered symbol, so a second copy of this
// module (an app bundling two versions) recognises it too; `replayed: true` alone is for people reading
// logs, since a handler's own error might carry such a field.
const replayedBrand = Symbol.for('@idem/core.replayedFailure');

/**
 * Whether `error` is a failure a wrapper of {@link makeIdempotent} replayed: under `storeOutcome: 'all'`
 * a thrown handler is kept, and every later delivery under its key throws an `Error` with the first
 * error's `name` and `message` (and `replayed: true`) without running the handler. Redelivering such
 * a message only replays the same failure, so a consumer dead-letters it; any other error is new
 * (the handler's own, or an `IdempotencyError` refusal).
 *
 * @example
 * ```ts
 * try {
 *   await processOrder(order);
 * } catch (error) {
 *   if (isReplayedFailure(error)) deadLetter(msg); // the first run failed; it will not run again
 *   else redeliverLater(msg);
 * }
 * ```
 */
export function isReplayedFailure(error: unknown): error is Error & { replayed: true } {
  return typeof error === 'object' && error !== null && (error as Record<symbol, unknown>)[replayedBrand] === true;
}

const unstorable = (cause?: unknown) =>
  new IdempotencyError(
    'response_not_replayable',
    'The handler ran, but its result could not be stored: it is not run again for this key.',
    { cause },
  );

// An unprotected run's signal: no lease, so nothing ever aborts it.
const unprotectedSignal = new AbortController().signal;

// What a result becomes once stored and read back, for a run that stored nothing.
function copyOf(result: unknown): unknown {
  let response: StoredResponse;
  try {
    response = encode(result);
  } catch (cause) {
    throw new IdempotencyError(
      'response_not_replayable',
      'The handler ran unprotected (the store could not be reached), but its result cannot be stored: nothing was kept, and a redelivery runs it again.',
      { cause },
    );
  }
  return decode(response);
}

function decode(response: StoredResponse): unknown {
  const text = () => Buffer.from(response.body).toString('utf8');
  switch (response.headers[kind]) {
    case 'undefined':
      return undefined;
    case 'bytes':
      return Buffer.from(response.body);
    case 'json':
      return JSON.parse(text());
    case 'error': {
      // A failure kept by the engine's `storeOutcome` policy ('all'): replayed as an error.
      const { name, message } = JSON.parse(text()) as { name: string; message: string };
      throw Object.defineProperty(Object.assign(new Error(message), { name, replayed: true }), replayedBrand, {
        value: true,
      });
    }
    default:
      // 'unstorable', or a record some other writer left under this operation and key.
      throw unstorable();
  }
}
