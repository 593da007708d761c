/**
 * What a request does when the store cannot be reached to claim its key (it rejects with its
 * `StoreUnavailableError`, as Redis and PostgreSQL do for a refused or lost connection or a server
 * that cannot serve right now, or does not answer within `storeTimeout`): anchors case 14. Any other
 * error the claim rejects with (a table never migrated, a missing grant, Redis's `NOPERM` or
 * `WRONGTYPE`, a claim that kept racing with releases: `StoreContendedError`, a bug in a store) is a
 * store that answered: it fails closed, since every retry would meet it again, or, for a contended
 * claim, run beside the key's live holder.
 * - `'fail-closed'` (the default): 503 `store_unavailable` with `Retry-After`; the handler never runs.
 * - `'fail-open'`: the handler runs unprotected, once for this request: its answer goes out as it is
 *   written, nothing is stored and nothing replayed, so a retry runs it again (once the store is back
 *   too: no record of this run exists). The engine's `store-error` event of the claim says
 *   `unprotected: true`. Only for operations where running twice costs less than refusing.
 *
 * Only the claim fails open: a store that answers (a key in progress, another request under the key)
 * is obeyed, and a failure once the key is claimed, or while waiting on a key in progress, is never
 * taken for a store that is down.
 */
export type StoreUnavailablePolicy = 'fail-closed' | 'fail-open';

/** `storeUnavailable`, checked: the default when left out, a TypeError for any other value. */
export function checkStoreUnavailable(value: unknown, name = 'storeUnavailable'): StoreUnavailablePolicy {
  if (value === undefined) return 'fail-closed';
  if (value === 'fail-closed' || value === 'fail-open') return value;
  // Named without JSON.stringify or String: a BigInt or an object without a prototype would make
  // them throw an error of their own in place of this one.
  const shown = typeof value === 'string' ? JSON.stringify(value) : value === null ? 'null' : typeof value;
  throw new TypeError(`${name} must be 'fail-closed' or 'fail-open', not ${shown}`);
}
