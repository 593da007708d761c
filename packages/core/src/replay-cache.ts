import type { StoreRecord } from './store.js';

/** A completed record, as the replay cache keeps it. */
export type CompletedRecord = Extract<StoreRecord, { state: 'completed' }>;

/** Completed outcomes of a shared store, kept in this process for a short while (`replayCache`). */
export interface ReplayCache {
  /** The record of `id` cached less than the cache's time ago, by `now` (epoch ms), or undefined. */
  get(id: string, now: number): CompletedRecord | undefined;
  /** Keeps `record` for the cache's time from `now`, dropping the oldest entry past the bound. */
  set(id: string, record: CompletedRecord, now: number): void;
}

/**
 * A bounded map of completed records, each good for `ttlMs` from when it was read from the store or
 * written to it. A hit does not extend it: however hot a key, the store is asked again once per
 * `ttlMs`, so a record the store forgot (its retention ended, an operator deleted it) stops being
 * replayed within that time. Past `entries`, the entry cached first goes (a hot key that loses its
 * place is cached again on its next read).
 *
 * @example
 * const cache = createReplayCache(1_000, 10_000);
 * cache.set(id, record, Date.now());
 * cache.get(id, Date.now()); // record, for one second
 */
export function createReplayCache(ttlMs: number, entries: number): ReplayCache {
  const items = new Map<string, { record: CompletedRecord; until: number }>();
  return {
    get(id, now) {
      const item = items.get(id);
      if (item === undefined) return undefined;
      if (now < item.until) return item.record;
      items.delete(id);
      return undefined;
    },
    set(id, record, now) {
      // Deleted first, so a refreshed entry moves to the back of the eviction order.
      items.delete(id);
      items.set(id, { record, until: now + ttlMs });
      if (items.size > entries) items.delete(items.keys().next().value as string);
    },
  };
}
