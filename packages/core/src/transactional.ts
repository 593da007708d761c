import type { Store, StoredResponse } from './store.js';

/**
 * A store that can run the handler's own writes and the completion in one transaction
 * (PostgreSQL). `fn` receives the store's transaction handle; when it returns, the store completes
 * the record with `response` (or deletes it when `response` is undefined) inside the same
 * transaction, compare-and-set on `token`. If the token is no longer current, everything rolls back
 * and the promise resolves `{ committed: false }`. If `fn` throws, everything rolls back and the
 * error propagates. If `fn` left the transaction unable to commit (in PostgreSQL a statement of its
 * own failed and it went on: 25P02), or the database refused the handler's writes at COMMIT (a
 * deferred constraint or constraint trigger), the store rejects with `TransactionAbortedError`,
 * which the engine takes for the handler's failure, not the store's.
 */
export interface TransactionalStore<Tx = unknown> extends Store {
  transaction<T>(
    input: { id: string; token: string },
    fn: (tx: Tx) => Promise<{ value: T; response: StoredResponse | undefined; retentionMs: number }>,
  ): Promise<{ committed: true; value: T } | { committed: false }>;
}

/** True when `store` implements {@link TransactionalStore}. */
export function isTransactionalStore(store: Store): store is TransactionalStore {
  return typeof (store as Partial<TransactionalStore>).transaction === 'function';
}
