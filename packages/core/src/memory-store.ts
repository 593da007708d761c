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

interface Entry {
  record: StoreRecord;
  expiresAt: number;
}

/**
 * An in-process {@link Store}: bounded, expiring by lease and retention on its own (injectable) clock.
 * For tests and single-process servers; it forgets everything when the process exits.
 *
 * @example
 * const store = memoryStore({ maxEntries: 10_000 });
 * const engine = createIdempotency({ store });
 */
export function memoryStore(options: MemoryStoreOptions = {}): Store & { readonly size: number } {
  const maxEntries = options.maxEntries ?? 100_000;
  if (!Number.isInteger(maxEntries) || maxEntries < 1) throw new TypeError('maxEntries must be a positive integer');
  const now = options.now ?? Date.now;
  // Map keeps insertion order; entries are deleted and re-inserted on every write, so the first
  // entries are always the least recently written ones, which makes eviction and sweeping cheap.
  const entries = new Map<string, Entry>();
  let writesSinceSweep = 0;

  const live = (id: string): Entry | undefined => {
    const entry = entries.get(id);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= now()) {
      entries.delete(id);
      return undefined;
    }
    return entry;
  };

  const write = (id: string, entry: Entry) => {
    entries.delete(id);
    entries.set(id, entry);
    if (++writesSinceSweep >= 64) {
      writesSinceSweep = 0;
      sweep(64);
    }
    if (entries.size > maxEntries) evict();
  };

  // Drops up to `budget` expired entries from the old end, so memory follows the retention.
  const sweep = (budget: number) => {
    const t = now();
    for (const [id, entry] of entries) {
      if (budget-- <= 0) break;
      if (entry.expiresAt <= t) entries.delete(id);
    }
  };

  const evict = () => {
    const t = now();
    for (const [id, entry] of entries) {
      if (entries.size <= maxEntries) return;
      if (entry.expiresAt <= t || entry.record.state === 'completed') entries.delete(id);
    }
  };

  return {
    get size() {
      return entries.size;
    },
    async claim({ id, token, fingerprint, leaseMs }: ClaimInput): Promise<ClaimResult> {
      const existing = live(id);
      if (existing) return { claimed: false, record: existing.record };
      write(id, { record: { state: 'in_progress', token, fingerprint }, expiresAt: now() + leaseMs });
      return { claimed: true };
    },
    async renew({ id, token, leaseMs }: RenewInput): Promise<boolean> {
      const existing = live(id);
      if (!existing || existing.record.state !== 'in_progress' || existing.record.token !== token) return false;
      existing.expiresAt = now() + leaseMs;
      return true;
    },
    async complete({ id, token, response, retentionMs }: CompleteInput): Promise<boolean> {
      const existing = live(id);
      if (!existing || existing.record.state !== 'in_progress' || existing.record.token !== token) return false;
      // Copy the body: the caller may reuse its buffer, and a replay must be the bytes of this moment.
      const stored = { status: response.status, headers: { ...response.headers }, body: new Uint8Array(response.body) };
      write(id, {
        record: { state: 'completed', token, fingerprint: existing.record.fingerprint, response: stored },
        expiresAt: now() + retentionMs,
      });
      return true;
    },
    async release({ id, token }: ReleaseInput): Promise<boolean> {
      const existing = live(id);
      if (!existing || existing.record.state !== 'in_progress' || existing.record.token !== token) return false;
      entries.delete(id);
      return true;
    },
    async get(id: string): Promise<StoreRecord | undefined> {
      return live(id)?.record;
    },
  };
}
