// describeStore()'s own paths that no store package's harness takes: the duration checks on a store
// whose clock the test drives (`advance`) instead of one that reports a `ttl`. And the contract on
// transactionalMemoryStore, a wrapper this package exports.
import { memoryStore } from '@idem/core';
import { expect, it } from 'vitest';
import { describeStore } from '../src/describe-store.js';
import { transactionalMemoryStore } from '../src/transactional-memory.js';

describeStore('memoryStore on a clock driven by the harness (advance)', async () => {
  let now = 1_000_000;
  return {
    store: memoryStore({ now: () => now }),
    expire: async () => {
      now += 400 * 86_400_000;
    },
    advance: async (ms) => {
      now += ms;
    },
  };
});

// transactionalMemoryStore forwards every operation of the Store contract (forget too) to its
// memory store: the whole contract on the wrapper, not only on what it wraps. (describeStore skips
// the forget checks on a store without forget: the next test says this one has it.)
it('transactionalMemoryStore forwards forget to its memory store', () => {
  const store = transactionalMemoryStore();
  store.claim({ id: 'a', token: 't', fingerprint: '', leaseMs: 1_000 });
  expect(store.forget?.({ id: 'a', token: 't' })).toBe(true);
  expect(store.get('a')).toBeUndefined();
});

describeStore('transactionalMemoryStore', async () => {
  let now = 1_000_000;
  return {
    store: transactionalMemoryStore({ store: memoryStore({ now: () => now }) }),
    expire: async () => {
      now += 400 * 86_400_000;
    },
    advance: async (ms) => {
      now += ms;
    },
    endLease: async (_id, leaseMs) => {
      now += leaseMs;
    },
  };
});
