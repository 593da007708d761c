// `complete` and `release` take the lease `begin` returned. Called with anything else (a caller that
// lost track of it, a lease of a `reject` or `replay` answer that has none), both must say so by name
// rather than fail deep inside with a property error, and neither may touch the store.
import { describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import { memoryStore } from '../src/memory-store.js';

const response = { status: 201, headers: {}, body: new Uint8Array() };

describe('a lease that begin did not return', () => {
  const notLeases = [undefined, null, {}, { id: 'x' }, { token: 7 }];

  it.each(notLeases)('complete(%j) rejects with a TypeError naming the lease', async (lease) => {
    const engine = createIdempotency({ store: memoryStore() });
    await expect(engine.complete(lease as never, response)).rejects.toThrow(
      new TypeError('complete needs the lease returned by begin'),
    );
  });

  it.each(notLeases)('release(%j) rejects with a TypeError naming the lease', async (lease) => {
    const engine = createIdempotency({ store: memoryStore() });
    await expect(engine.release(lease as never)).rejects.toThrow(
      new TypeError('release needs the lease returned by begin'),
    );
  });

  it('a real lease still releases, and its key can be claimed again', async () => {
    const engine = createIdempotency({ store: memoryStore() });
    const input = { key: 'k', scope: 's', operation: 'POST /x', fingerprint: 'f' };
    const first = await engine.begin(input);
    if (first.kind !== 'execute') throw new Error(`expected execute, got ${first.kind}`);
    await expect(engine.release(first.lease)).resolves.toEqual({ ok: true });
    expect((await engine.begin(input)).kind).toBe('execute');
  });
});
