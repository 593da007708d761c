// One rule, in one place, for "the store could not be reached": `isStoreUnavailableError`, used by the
// HTTP adapters (a transactional handler's failure), the webhook receiver (an `apply` that failed) and
// `@idem/postgres` (an error already classified). By name, as `isTransactionAbortedError`: a store
// built against another installed copy of @idem/core raises that copy's class, which `instanceof`
// does not know.
import { describe, expect, it } from 'vitest';
import { isStoreUnavailableError, StoreUnavailableError } from '../src/index.js';

describe('isStoreUnavailableError', () => {
  it("recognises this copy's StoreUnavailableError", () => {
    expect(isStoreUnavailableError(new StoreUnavailableError('Redis get failed'))).toBe(true);
  });

  it("recognises another copy's: an Error whose name is StoreUnavailableError", () => {
    const foreign = Object.assign(new Error('PostgreSQL store unavailable during claim'), {
      name: 'StoreUnavailableError',
    });
    expect(foreign).not.toBeInstanceOf(StoreUnavailableError);
    expect(isStoreUnavailableError(foreign)).toBe(true);
  });

  it.each([
    ['a bug', new TypeError('connection terminated: data.user is undefined')],
    ['a plain Error that only says so', new Error('StoreUnavailableError')],
    ['an object that is no Error', { name: 'StoreUnavailableError', message: 'unavailable' }],
    ['a string', 'StoreUnavailableError'],
    ['nothing', undefined],
  ])('does not take %s', (_what, value) => {
    expect(isStoreUnavailableError(value)).toBe(false);
  });
});
