// describeStore()'s own paths that no store package's harness takes: the duration checks on a store
// whose clock the test drives (`advance`) instead of one that reports a `ttl`.
import { memoryStore } from '@idem/core';
import { describeStore } from '../src/describe-store.js';

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
