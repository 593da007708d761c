import type { ClaimInput, ClaimResult, CompleteInput, ReleaseInput, RenewInput, Store, StoreRecord } from './store.js';

/** Options of {@link memoryStore}. */
export interface MemoryStoreOptions {
  /**
   * Most records kept. When full, expired records go first, then the oldest completed ones (a retry
   * of such a key would run again). Records in progress are never evicted: that would allow a second
   * execution. Default 100,000.
   */
  maxEntries?: number;
  /** The store's clock, in epoch milliseconds. Inject one in tests. Default `Date.now`. */
  now?: () => number;
}

// Shared: a claim that succeeded carries no data, and a fresh object per claim is only garbage.
const CLAIMED: ClaimResult = Object.freeze({ claimed: true });

interface Entry {
  id: string;
  record: StoreRecord;
  expiresAt: number;
  /** Set when the entry leaves the map, so the queue can skip it without a lookup in a large map. */
  gone: boolean;
}

/**
 * An in-process {@link Store}: bounded, expiring by lease and retention on its own (injectable) clock.
 * For tests and single-process servers; it forgets everything when the process exits. Its methods
 * answer synchronously (the Store contract allows it), so the engine awaits nothing on this store.
 *
 * @example
 * const store = memoryStore({ maxEntries: 10_000 });
 * const engine = createIdempotency({ store });
 */
export function memoryStore(options: MemoryStoreOptions = {}): Store & { readonly size: number } {
  const maxEntries = options.maxEntries ?? 100_000;
  if (!Number.isInteger(maxEntries) || maxEntries < 1) throw new TypeError('maxEntries must be a positive integer');
  const now = options.now ?? Date.now;
  const entries = new Map<string, Entry>();
  // Every write is also appended to this queue, so the oldest writes are found at `head` in O(1).
  // (Iterating the Map from its front would walk the tombstones V8 leaves behind deleted entries,
  // which turns eviction quadratic.) Queue slots whose entry was replaced or deleted are skipped.
  let queue: Entry[] = [];
  let head = 0;
  let writesSinceSweep = 0;

  const remove = (entry: Entry) => {
    entries.delete(entry.id);
    entry.gone = true;
  };

  const live = (id: string): Entry | undefined => {
    const entry = entries.get(id);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= now()) {
      remove(entry);
      return undefined;
    }
    return entry;
  };

  const compact = () => {
    if (head > 1_024 && head * 2 > queue.length) {
      queue = queue.slice(head);
      head = 0;
    }
  };

  const write = (entry: Entry) => {
    entries.set(entry.id, entry);
    queue.push(entry);
    if (++writesSinceSweep >= 64) {
      writesSinceSweep = 0;
      sweep(64);
    }
    if (entries.size > maxEntries) evict();
    compact();
  };

  // Drops expired or superseded entries from the old end, so memory follows the retention.
  const sweep = (budget: number) => {
    const t = now();
    while (budget-- > 0 && head < queue.length) {
      const entry = queue[head] as Entry;
      if (entry.gone) head++;
      else if (entry.expiresAt <= t) {
        remove(entry);
        head++;
      } else return;
    }
  };

  const evict = () => {
    const t = now();
    // Bounded by the queue as it is now: records in progress go back to the tail, never out.
    let budget = queue.length - head;
    while (entries.size > maxEntries && budget-- > 0 && head < queue.length) {
      const entry = queue[head++] as Entry;
      if (entry.gone) continue;
      if (entry.expiresAt <= t || entry.record.state === 'completed') remove(entry);
      else queue.push(entry);
    }
  };

  return {
    inProcess: true,
    get size() {
      return entries.size;
    },
    claim({ id, token, fingerprint, leaseMs }: ClaimInput): ClaimResult {
      const existing = live(id);
      if (existing) return { claimed: false, record: existing.record };
      write({ id, record: { state: 'in_progress', token, fingerprint }, expiresAt: now() + leaseMs, gone: false });
      return CLAIMED;
    },
    renew({ id, token, leaseMs }: RenewInput): boolean {
      const existing = live(id);
      if (existing?.record.state !== 'in_progress' || existing.record.token !== token) return false;
      existing.expiresAt = now() + leaseMs;
      return true;
    },
    complete({ id, token, response, retentionMs }: CompleteInput): boolean {
      const existing = live(id);
      if (existing?.record.state !== 'in_progress' || existing.record.token !== token) return false;
      // Copy the body: the caller may reuse its buffer, and a replay must be the bytes of this moment.
      const stored = { status: response.status, headers: { ...response.headers }, body: new Uint8Array(response.body) };
      // Completed in place: the entry keeps its place in the eviction queue (claim order), which
      // spares a second queue slot and eviction pass per execution.
      existing.record = { state: 'completed', token, fingerprint: existing.record.fingerprint, response: stored };
      existing.expiresAt = now() + retentionMs;
      return true;
    },
    release({ id, token }: ReleaseInput): boolean {
      const existing = live(id);
      if (existing?.record.state !== 'in_progress' || existing.record.token !== token) return false;
      remove(existing);
      return true;
    },
    get(id: string): StoreRecord | undefined {
      return live(id)?.record;
    },
  };
}
