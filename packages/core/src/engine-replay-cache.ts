import { Buffer } from 'node:buffer';
import { toMilliseconds } from './duration.js';
import type { IdempotencyOptions } from './engine-options.js';
import type { Lease } from './engine-types.js';
import { assertKnownOptions } from './option-names.js';
import { type CompletedRecord, createReplayCache, type ReplayCache } from './replay-cache.js';
import type { StoredResponse } from './store.js';

// The record a completion leaves in the store, as a read would give it back: a copy of what
// `complete` was given, as a store keeps one, so a caller of the engine that reuses its response
// object afterwards does not change what the cache replays.
export function completedRecord(lease: Lease, response: StoredResponse): CompletedRecord {
  const copy: StoredResponse = {
    status: response.status,
    headers: { ...response.headers },
    body: Buffer.from(response.body),
  };
  if (response.statusMessage !== undefined) copy.statusMessage = response.statusMessage;
  return { state: 'completed', token: lease.token, fingerprint: lease.fingerprint, response: copy };
}

const knownReplayCacheOptions: ReadonlySet<string> = new Set<
  keyof Exclude<IdempotencyOptions['replayCache'], false | undefined>
>(['ttl', 'entries']);

/**
 * The `replayCache` option, checked: undefined when off, or for a store in this process, which
 * answers as fast as the cache would.
 */
export function replayCacheOf(option: IdempotencyOptions['replayCache'], inProcess: boolean): ReplayCache | undefined {
  if (option === undefined || option === false) return undefined;
  if (option === null || typeof option !== 'object')
    throw new TypeError('replayCache must be { ttl, entries? } or false');
  assertKnownOptions(option, knownReplayCacheOptions, 'replayCache');
  const ttlMs = toMilliseconds(option.ttl, 'replayCache.ttl');
  if (!(ttlMs >= 1) || ttlMs > 3_600_000) throw new TypeError('replayCache.ttl must be from 1ms to 1h');
  // Only a field left out (or undefined) takes the default: a null is refused as a bound that means
  // nothing, as 0 is, not read as "the default".
  const entries = option.entries === undefined ? 10_000 : option.entries;
  if (!Number.isSafeInteger(entries) || entries < 1)
    throw new TypeError('replayCache.entries must be a positive integer');
  return inProcess ? undefined : createReplayCache(ttlMs, entries);
}
