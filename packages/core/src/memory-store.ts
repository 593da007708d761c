import { Buffer } from 'node:buffer';
import { notify } from './notify.js';
import type { ClaimInput, ClaimResult, CompleteInput, ReleaseInput, RenewInput, Store, StoreRecord } from './store.js';

/** Options of {@link memoryStore}. */
export interface MemoryStoreOptions {
  /**
   * Most records kept. When full, expired records go first, then the oldest completed ones (a retry
   * of such a key would run again). Records in progress are never evicted: that would allow a second
   * execution. Default 100,000.
   */
  maxEntries?: number;
  /**
   * Called when a completed record is dropped to make room before its retention ended: a retry of
   * that key would run again, which is what retention exists to prevent. When it fires, raise
   * `maxEntries` or move to a shared store. Dropping expired records is not reported. What it throws
   * or rejects with is swallowed: an observer must never fail the claim that made room.
   */
  onEvict?: (eviction: MemoryEviction) => void;
  /** The store's clock, in epoch milliseconds. Inject one in tests. Default `Date.now`. */
  now?: () => number;
}

/** A completed record that {@link memoryStore} dropped before its retention ended. */
export interface MemoryEviction {
  /** The record id (as in the engine's events). */
  id: string;
  /** When its retention would have ended, in epoch milliseconds on the store's clock. */
  expiresAt: number;
  /** When it was dropped, on the same clock. */
  at: number;
}

/** What {@link memoryStore} returns: a {@link Store} that also reports how full it is. */
export interface MemoryStore extends Store {
  /** Records held now, in progress or completed. */
  readonly size: number;
  /** Completed records dropped before their retention ended, since the store was made (see `onEvict`). */
  readonly evicted: number;
}

// Shared: a claim that succeeded carries no data, and a fresh object per claim is only garbage.
const CLAIMED: ClaimResult = Object.freeze({ claimed: true });

/**
 * One record, in one object. Everything a record holds survives many young-generation collections
 * (it lives until eviction or retention ends), and each collection copies every surviving object: so
 * a record is one entry plus its id, token, headers and body, with no separate record or response
 * objects. The {@link StoreRecord} that callers see is built on first read and kept (`view`).
 */
class Entry {
  /** Set when the entry leaves the map, so the queue can skip it without a lookup in a large map. */
  gone = false;
  completed = false;
  status = 0;
  headers: Record<string, string> | undefined = undefined;
  /** The body as a Latin-1 string, one byte per character: one plain heap object, cheapest to keep. */
  body = '';
  view: StoreRecord | undefined = undefined;

  constructor(
    readonly id: string,
    readonly token: string,
    readonly fingerprint: string,
    public expiresAt: number,
  ) {}
}

function viewOf(entry: Entry): StoreRecord {
  if (entry.view !== undefined) return entry.view;
  const { token, fingerprint } = entry;
  const view: StoreRecord = entry.completed
    ? {
        state: 'completed',
        token,
        fingerprint,
        response: {
          status: entry.status,
          headers: entry.headers as Record<string, string>,
          body: Buffer.from(entry.body, 'latin1'),
        },
      }
    : { state: 'in_progress', token, fingerprint };
  entry.view = view;
  // The view holds the bytes now; keeping the string too would double what a replayed record costs.
  if (entry.completed) entry.body = '';
  return view;
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
export function memoryStore(options: MemoryStoreOptions = {}): MemoryStore {
  const maxEntries = options.maxEntries ?? 100_000;
  if (!Number.isInteger(maxEntries) || maxEntries < 1) throw new TypeError('maxEntries must be a positive integer');
  const { onEvict } = options;
  if (onEvict !== undefined && typeof onEvict !== 'function') throw new TypeError('onEvict must be a function');
  const now = options.now ?? Date.now;
  let evicted = 0;
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

  // Each operation reads the clock once and hands the reading on: a clock read costs as much as a
  // lookup in a small map, and an operation used to make up to four.
  const live = (id: string, t: number): Entry | undefined => {
    const entry = entries.get(id);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= t) {
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

  const write = (entry: Entry, t: number) => {
    entries.set(entry.id, entry);
    queue.push(entry);
    if (++writesSinceSweep >= 64) {
      writesSinceSweep = 0;
      sweep(64, t);
    }
    if (entries.size > maxEntries) evict(t);
    compact();
  };

  // Drops expired or superseded entries from the old end, so memory follows the retention.
  const sweep = (budget: number, t: number) => {
    while (budget-- > 0 && head < queue.length) {
      const entry = queue[head] as Entry;
      if (entry.gone) head++;
      else if (entry.expiresAt <= t) {
        remove(entry);
        head++;
      } else return;
    }
  };

  const evict = (t: number) => {
    // Bounded by the queue as it is now: records in progress go back to the tail, never out.
    let budget = queue.length - head;
    while (entries.size > maxEntries && budget-- > 0 && head < queue.length) {
      const entry = queue[head++] as Entry;
      if (entry.gone) continue;
      if (entry.expiresAt <= t) remove(entry);
      else if (entry.completed) {
        remove(entry);
        evicted++;
        // An observer must never fail the claim that made room.
        if (onEvict) notify(onEvict, { id: entry.id, expiresAt: entry.expiresAt, at: t });
      } else queue.push(entry);
    }
  };

  return {
    inProcess: true,
    get size() {
      return entries.size;
    },
    get evicted() {
      return evicted;
    },
    claim({ id, token, fingerprint, leaseMs }: ClaimInput): ClaimResult {
      const t = now();
      const existing = live(id, t);
      if (existing) return { claimed: false, record: viewOf(existing) };
      write(new Entry(id, token, fingerprint, t + leaseMs), t);
      return CLAIMED;
    },
    renew({ id, token, leaseMs }: RenewInput): boolean {
      const t = now();
      const existing = live(id, t);
      if (existing === undefined || existing.completed || existing.token !== token) return false;
      existing.expiresAt = t + leaseMs;
      return true;
    },
    complete({ id, token, response, retentionMs }: CompleteInput): boolean {
      const t = now();
      const existing = live(id, t);
      if (existing === undefined || existing.completed || existing.token !== token) return false;
      // Copies of headers and body: the caller may reuse its objects, and a replay must be the bytes
      // of this moment. Completed in place: the entry keeps its place in the eviction queue (claim
      // order), which spares a second queue slot and eviction pass per execution.
      const body = response.body;
      existing.completed = true;
      existing.status = response.status;
      existing.headers = { ...response.headers };
      existing.body = Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('latin1');
      existing.view = undefined;
      existing.expiresAt = t + retentionMs;
      return true;
    },
    release({ id, token }: ReleaseInput): boolean {
      const existing = live(id, now());
      if (existing === undefined || existing.completed || existing.token !== token) return false;
      remove(existing);
      return true;
    },
    get(id: string): StoreRecord | undefined {
      const entry = live(id, now());
      return entry === undefined ? undefined : viewOf(entry);
    },
  };
}
