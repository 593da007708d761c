import { assertStoreId, type MemoryStore, memoryStore, type TransactionalStore } from '@idem/core';

/** How a {@link transactionalMemoryStore} transaction ended. */
export type TransactionOutcome = 'committed' | 'rolled-back' | 'lost';

/** Options of {@link transactionalMemoryStore}. */
export interface TransactionalMemoryOptions {
  /** The memory store underneath (default: a new `memoryStore()`). */
  store?: MemoryStore | undefined;
  /** Told how each transaction ended. */
  onOutcome?: ((id: string, outcome: TransactionOutcome) => void) | undefined;
  /** Awaited before each commit, e.g. to hold a commit while a test looks at the held response. */
  beforeCommit?: (() => Promise<void> | void) | undefined;
}

/**
 * A memory store with transactions whose "writes" are the completion itself (`tx` is `{ id }`):
 * enough to test what an engine or adapter commits in transactional mode without a database. A
 * handler that throws rolls back; a token that is no longer current makes the commit `lost`.
 *
 * @example
 * const store = transactionalMemoryStore();
 * app.post('/charges', idempotency({ store, transactional: true }), handler);
 */
export function transactionalMemoryStore(options: TransactionalMemoryOptions = {}): TransactionalStore<{ id: string }> {
  const store = options.store ?? memoryStore();
  const told = (id: string, outcome: TransactionOutcome) => options.onOutcome?.(id, outcome);
  return {
    claim: (input) => store.claim(input),
    renew: (input) => store.renew(input),
    complete: (input) => store.complete(input),
    release: (input) => store.release(input),
    forget: (input) => store.forget(input),
    get: (id) => store.get(id),
    async transaction(input, fn) {
      // Before the handler, as every store's transaction refuses them: its commit could not land.
      assertStoreId(input.id, 'id');
      assertStoreId(input.token, 'token');
      let produced: Awaited<ReturnType<typeof fn>>;
      try {
        produced = await fn({ id: input.id });
      } catch (error) {
        told(input.id, 'rolled-back');
        throw error;
      }
      await options.beforeCommit?.();
      const ok =
        produced.response === undefined
          ? await store.release(input)
          : await store.complete({ ...input, response: produced.response, retentionMs: produced.retentionMs });
      told(input.id, ok ? 'committed' : 'lost');
      return ok ? { committed: true, value: produced.value } : { committed: false };
    },
  };
}
