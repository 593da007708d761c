// Configuration-mistake audit of the core factories. Each test states what a user expects from a
// wrong option: a TypeError at construction naming it, or the documented meaning. `it.fails` marks a
// defect that still exists.
import { describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';

// A keyed POST /charges of one caller, with no body.
const charge = (keyHeader: string) => ({
  method: 'POST',
  route: '/charges',
  path: '/charges',
  query: '',
  contentType: undefined,
  keyHeader,
  body: undefined,
  scope: 'caller',
});

// The memory store seen as a shared one (as Redis or PostgreSQL are): not in process, and answering
// after `latencyMs`, as a store across a network does.
function sharedLike(latencyMs: number): Store {
  const inner = memoryStore();
  const later = <T>(value: T | Promise<T>) => new Promise<T>((resolve) => setTimeout(() => resolve(value), latencyMs));
  return {
    claim: (input) => later(inner.claim(input)),
    renew: (input) => later(inner.renew(input)),
    complete: (input) => later(inner.complete(input)),
    release: (input) => later(inner.release(input)),
    get: (id) => later(inner.get(id)),
  };
}

// Builds with `make`; a TypeError that names `option` is the right answer, else `check` must pass.
async function refusedOrHonoured<T>(option: string, make: () => T, check: (made: T) => Promise<void> | void) {
  let made: T;
  try {
    made = make();
  } catch (error) {
    expect(error).toBeInstanceOf(TypeError);
    expect((error as Error).message).toContain(option);
    return;
  }
  await check(made);
}

describe('core options: configuration mistakes', () => {
  // Was a defect: `strictKeys: 'false'` (a string, as read from an environment variable) is taken as
  // true, so every plain `Idempotency-Key: k-1` is refused 400 while `required`, `mintKeys` and
  // `advertiseExpiry` refuse a non-boolean; expected: a TypeError naming strictKeys.
  it('strictKeys that is not a boolean is refused, not read as strict mode', async () => {
    await refusedOrHonoured(
      'strictKeys',
      () => createHttpIdempotency({ store: memoryStore(), strictKeys: 'false' as never }),
      async (http) => {
        const started = await http.begin(charge('k-1'));
        expect(started.kind).toBe('execute');
      },
    );
  });

  // Was a defect: `replayHeaders: 'x-request-cost'` (a string, not an array) is iterated character by
  // character: the single letters are added to the allowlist, no error, and the header is never
  // replayed; expected: a TypeError naming replayHeaders (as fingerprint.headers does).
  it('replayHeaders given as a string is refused, not split into letters', async () => {
    await refusedOrHonoured(
      'replayHeaders',
      () => createHttpIdempotency({ store: memoryStore(), replayHeaders: 'x-request-cost' as never }),
      async (http) => {
        const first = await http.begin(charge('k-1'));
        if (first.kind !== 'execute') throw new Error('first run did not execute');
        const stored = { status: 201, headers: { 'x-request-cost': '3' }, body: new Uint8Array(0) };
        await http.engine.complete(first.lease, stored);
        const second = await http.begin(charge('k-1'));
        expect(second.kind).toBe('respond');
        if (second.kind === 'respond') expect(second.response.headers['x-request-cost']).toBe('3');
      },
    );
  });

  // Was a defect: `storeTimeout: 0` is accepted, and with a shared store that takes 10 ms to answer,
  // every claim times out: every covered request is answered 503 store_unavailable, for ever (users
  // often read 0 as "no timeout"); expected: a TypeError naming storeTimeout (a positive duration),
  // as `lease` has a lower bound.
  it('storeTimeout: 0 is refused rather than failing every request with 503', async () => {
    await refusedOrHonoured(
      'storeTimeout',
      () => createIdempotency({ store: sharedLike(10), storeTimeout: 0 }),
      async (engine) => {
        const started = await engine.begin({ key: 'k-1', scope: 'caller', operation: 'POST /charges' });
        expect(started.kind === 'reject' ? started.error.code : started.kind).toBe('execute');
      },
    );
  });

  // Was a defect: a store without `renew`, `get` and `release` passes the check whose message says they
  // are required; the heartbeat then fails on every tick (lease lost after one lease), and a release
  // answers store-error, per request; expected: a TypeError at construction, as the message says.
  it('a store missing renew, get or release is refused at construction', () => {
    const inner = memoryStore();
    const partial = {
      claim: (input: Parameters<Store['claim']>[0]) => inner.claim(input),
      complete: (input: Parameters<Store['complete']>[0]) => inner.complete(input),
    };
    expect(() => createIdempotency({ store: partial as never })).toThrow(TypeError);
  });

  // Was a defect: `onEvent: 'metrics'` (not a function) is accepted and every event is dropped in
  // silence, while memoryStore refuses an `onEvict` that is not a function; expected: a TypeError
  // naming onEvent.
  it('onEvent that is not a function is refused', () => {
    expect(() => createIdempotency({ store: memoryStore(), onEvent: 'metrics' as never })).toThrow(/onEvent/);
  });

  // Was a defect: `heartbeat: 'false'` is accepted and read as true (and `heartbeat: 0` as false), while
  // the HTTP layer's boolean options refuse a non-boolean; expected: a TypeError naming heartbeat.
  it('heartbeat that is not a boolean is refused', () => {
    expect(() => createIdempotency({ store: memoryStore(), heartbeat: 'false' as never })).toThrow(/heartbeat/);
  });
});
