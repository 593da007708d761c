import { StoreUnavailableError } from './errors.js';
import type { StoreRecord } from './store.js';
import { assertStoredResponse } from './stored-response.js';

/**
 * Why a record a store answered cannot be acted on, as the `StoreUnavailableError` the engine
 * answers it with (503 `store_unavailable`, and a `store-error` event), or `undefined` for a record
 * it can act on.
 *
 * The engine checks every response before a store keeps it, but a store is shared: a record may
 * have been written by another version, a restore, a migration or a hand-rolled tool. A completed
 * record must hold a response that passes {@link assertStoredResponse}, or its replay would reach
 * `writeHead` and throw (a framework's 500, or Fastify closing the connection), or go out as
 * something no handler sent (`content-type: [object Object]`, a status 200.5 sent as 200). It is no
 * answer to replay, and nothing may run under its key either (the first execution may have had its
 * effect), so it is treated as a store that cannot serve: 503, the same as a Redis value idem
 * cannot decode, until an operator deletes the record or its retention ends.
 *
 * @example
 * const broken = unreadableRecord({ state: 'completed', token: 't', fingerprint: '', response: { status: 0, headers: {}, body } });
 * broken?.code; // 'store_unavailable'
 */
export function unreadableRecord(record: StoreRecord): StoreUnavailableError | undefined {
  if (record.state === 'in_progress' || record.state === 'abandoned') {
    return typeof record.fingerprint === 'string' && typeof record.token === 'string'
      ? undefined
      : new StoreUnavailableError('The store returned a record without a token or fingerprint to compare');
  }
  if (record.state !== 'completed' || typeof record.fingerprint !== 'string') {
    return new StoreUnavailableError('The store returned a record in no state the engine knows');
  }
  try {
    assertStoredResponse(record.response);
    return undefined;
  } catch (cause) {
    return new StoreUnavailableError('The store returned a completed record whose response cannot be replayed', {
      cause,
    });
  }
}
