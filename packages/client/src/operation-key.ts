import type { RequestOptions } from './client-options.js';
import { formatKeyField, type KeyFormat, newIdempotencyKey, parseKeyField } from './idempotency-key.js';
import { isIdempotentMethod } from './retry-decision.js';

/**
 * The key one operation carries, as {@link chooseKey} chose it.
 *
 * @example
 * const { key, field } = chooseKey(undefined, new Headers(), 'POST', 'sf-string'); // a fresh key, quoted
 */
export interface OperationKey {
  /** The key, decoded; `undefined` when the operation carries none (yet). */
  key: string | undefined;
  /** The `Idempotency-Key` field as sent; `undefined` when none is. */
  field: string | undefined;
  /**
   * A key the caller chose is theirs: they may have stored it to retry this operation later, so
   * an echo of another key (a proxy or server rewriting it) never replaces it. Only a key this
   * client made up, or none at all, gives way to the one the server minted.
   */
  callerKeyed: boolean;
}

/**
 * Chooses the key of one operation: the caller's `idempotencyKey`, else an `Idempotency-Key` header
 * the call set by hand, else a fresh one for a method that is not idempotent. Takes the header out of
 * `headers` (the key is set on each attempt's own headers). Throws a `TypeError` for a key of the
 * wrong type or an empty header.
 *
 * @example
 * const chosen = chooseKey(request.idempotencyKey, headers, 'POST', 'sf-string');
 */
export function chooseKey(
  idempotencyKey: RequestOptions['idempotencyKey'],
  headers: Headers,
  method: string,
  keyFormat: KeyFormat,
): OperationKey {
  let key: string | undefined;
  let field: string | undefined;
  let callerKeyed = false;
  if (idempotencyKey !== undefined && idempotencyKey !== false && typeof idempotencyKey !== 'string') {
    throw new TypeError('idempotencyKey must be a string or false');
  }
  const headerKey = headers.get('idempotency-key');
  headers.delete('idempotency-key');
  if (typeof idempotencyKey === 'string') {
    key = idempotencyKey;
    field = formatKeyField(key, keyFormat);
    callerKeyed = true;
  } else if (idempotencyKey === false) {
    // No key until the server mints one.
  } else if (headerKey !== null) {
    // Headers trim the value, so a blank one arrives empty. Sent, it would make the request count
    // as keyed and be repeated, while a server treats an empty key as none (or refuses it).
    if (headerKey === '') throw new TypeError('an Idempotency-Key header must not be empty');
    // A key set by hand as a header is sent as written.
    field = headerKey;
    key = parseKeyField(headerKey) ?? headerKey;
    callerKeyed = true;
  } else if (!isIdempotentMethod(method)) {
    key = newIdempotencyKey();
    field = formatKeyField(key, keyFormat);
  }
  return { key, field, callerKeyed };
}

/**
 * The key a response's `Idempotency-Key` echoes when the operation is to take it from now on, else
 * `undefined`: see {@link OperationKey.callerKeyed}.
 *
 * @example
 * const minted = mintedKey(response.headers, 'POST', false, undefined); // { key, field } when the server minted one
 */
export function mintedKey(
  headers: Headers,
  method: string,
  callerKeyed: boolean,
  key: string | undefined,
): { key: string; field: string } | undefined {
  // Spec 3.1 rule 3: a key the server minted is attached to every later retry, exactly as the
  // server wrote it, so the server recognises its own key whatever syntax it prefers. Only a
  // write takes one: a key echoed on a GET or PUT would make its real conflict (409) retried.
  const echoed = headers.get('idempotency-key');
  const echoedKey = parseKeyField(echoed);
  if (!callerKeyed && !isIdempotentMethod(method) && echoed !== null && echoedKey !== undefined && echoedKey !== key) {
    return { key: echoedKey, field: echoed.trim() };
  }
  return undefined;
}
