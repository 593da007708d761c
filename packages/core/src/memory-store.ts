import { Buffer } from 'node:buffer';
import { notify } from './notify.js';
import { assertKnownOptions } from './option-names.js';
import type {
  ClaimInput,
  ClaimResult,
  CompleteInput,
  ForgetInput,
  ReleaseInput,
  RenewInput,
  Store,
  StoreRecord,
} from './store.js';
import { ResponseTooLargeError, storedResponseSize } from './stored-response.js';

/** Options of {@link memoryStore}. */
export interface MemoryStoreOptions {
  /**
   * Most records kept. When full, every expired record goes first (whatever its duration), then the
   * completed and abandoned ones nearest their end (a retry of such a key would run again, and an
   * abandoned key would no longer refuse other parameters). Records whose lease is live are never
   * evicted: that would allow a second execution beside the first. Default 100,000.
   */
  maxEntries?: number | undefined;
  /**
   * Most bytes kept, counted as the ids, tokens, fingerprints, header names and values and bodies of
   * the records (not the JavaScript objects around them, about 200 bytes a record more). When over,
   * records make room as for `maxEntries`; one response bigger than the whole budget is refused with
   * `ResponseTooLargeError` (the engine then serves it unstored and frees the key). The store declares
   * it as its `maxResponseBytes`, so the HTTP adapters settle such a response in advance as one over
   * their own `maxResponseBytes` (served; by default the key is kept with `response_not_replayable`,
   * so a retry does not run the operation again). A count alone does
   * not bound memory: 100,000 records of 1 MiB responses are 100 GiB. Default 256 MiB.
   */
  maxBytes?: number | undefined;
  /**
   * Called when a completed (or abandoned) record is dropped to make room before its retention ended:
   * a retry of that key would run again, which is what retention exists to prevent. When it fires, raise
   * `maxEntries` (or `maxBytes`) or move to a shared store. Dropping expired records is not reported. What it throws
   * or rejects with is swallowed: an observer must never fail the claim that made room.
   */
  onEvict?: ((eviction: MemoryEviction) => void) | undefined;
  /**
   * The store's clock, in epoch milliseconds. Inject one in tests. Default: the time the process
   * started plus a monotonic clock since, which a wall clock stepped by NTP or a resumed VM does not
   * move (an hour forward would end every live lease at once, and a retry would run beside the
   * handler).
   */
  now?: (() => number) | undefined;
}

/** A completed (or abandoned) record that {@link memoryStore} dropped before its retention ended. */
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
  /** Records held now: in progress, abandoned or completed. */
  readonly size: number;
  /** Bytes those records hold, counted as `maxBytes` counts them. */
  readonly bytes: number;
  /** Completed (or abandoned) records dropped before their end, since the store was made (see `onEvict`). */
  readonly evicted: number;
  /** Always there on this store (see {@link Store.forget}); what it held leaves `size` and `bytes`. */
  forget(input: ForgetInput): boolean;
}

// An entry that may be dropped to make room: completed, or abandoned (its lease ran out unrenewed).
// Never one whose lease is live: that would let a second execution run beside it.
const settled = (entry: Entry, t: number): boolean => entry.completed || leaseEnd(entry) <= t;

// When the lease of an entry in progress ends: its expiry less its keep. Not a field of its own: a
// time is a heap number in V8, one more object per record for the collector to copy.
const leaseEnd = (entry: Entry): number => entry.expiresAt - entry.keepMs;

// When an entry's slot in its lane is due: the lease's end while it holds a lease, else its expiry.
const dueAt = (entry: Entry): number => (entry.completed || entry.inKeepLane ? entry.expiresAt : leaseEnd(entry));

// Shared: a claim that succeeded carries no data, and a fresh object per claim is only garbage.
const CLAIMED: ClaimResult = Object.freeze({ claimed: true });

/**
 * One record, in one object. Everything a record holds survives many young-generation collections
 * (it lives until eviction or retention ends), and each collection copies every surviving object: so
 * a record is one entry plus its id, token, headers and body, with no separate record or response
 * objects. Readers get a fresh {@link StoreRecord} built from it (see {@link recordOf}).
 */
class Entry {
  /** Set when the entry leaves the map, so the lanes can skip it without a lookup in a large map. */
  gone = false;
  /** What it counts against `maxBytes` (see `sizeOf`). */
  bytes = 0;
  completed = false;
  status = 0;
  headers: Record<string, string> | undefined = undefined;
  /** The body as a Latin-1 string, one byte per character: one plain heap object, cheapest to keep. */
  body = '';
  /**
   * While in progress: how long it stays, abandoned, after its lease ends (at `expiresAt - keepMs`),
   * carried over by renewals.
   */
  keepMs = 0;
  /** Filed in its keep's lane, once its lease ended unrenewed (where it is, not what it is: see `settled`). */
  inKeepLane = false;
  /** The lane of this entry's current expiry, and how many slots it has there (a renewal adds one). */
  lane: Lane | undefined = undefined;
  slots = 0;

  constructor(
    readonly id: string,
    public token: string,
    public fingerprint: string,
    public expiresAt: number,
  ) {}
}

/**
 * The entries whose expiry was last set with one duration (a lease of 10 s, a retention of 24 h), in
 * the order it was set. The clock only moves forward, so within a lane they expire in that order:
 * the expired ones are always at the head, whatever the other lanes hold. One queue for all durations
 * would not do: a record kept 1 h behind one kept 24 h would outlive its retention there, and the
 * store would make room by dropping a record still within its retention.
 */
class Lane {
  entries: Entry[] = [];
  head = 0;
}

// Durations beyond this many distinct ones share lanes, rounded up to a power of two of milliseconds:
// a store fed computed retentions must not grow a lane per record. Such a lane is only roughly in
// expiry order (an entry can stay up to its duration's rounding past its expiry).
const maxExactLanes = 32;

/** A fresh record for a reader: callers may change what they get, and later reads must not see it. */
function recordOf(entry: Entry, t: number): StoreRecord {
  const { token, fingerprint } = entry;
  if (!entry.completed && leaseEnd(entry) <= t) return { state: 'abandoned', token, fingerprint };
  return entry.completed
    ? {
        state: 'completed',
        token,
        fingerprint,
        response: {
          status: entry.status,
          headers: { ...entry.headers },
          body: Buffer.from(entry.body, 'latin1'),
        },
      }
    : { state: 'in_progress', token, fingerprint };
}

// What a record counts against `maxBytes`: its strings, one byte a character (the body is Latin-1;
// ids, tokens and fingerprints are ASCII; a header value is a byte string to HTTP).
function sizeOf(id: string, token: string, fingerprint: string, headers?: Record<string, string>, body = 0): number {
  let bytes = id.length + token.length + fingerprint.length + body;
  if (headers !== undefined) for (const name in headers) bytes += name.length + (headers[name] as string).length;
  return bytes;
}

const DEFAULT_MAX_BYTES = 256 * 1024 * 1024;

// Read from the global at each call (fake timers replace it), as epoch-like milliseconds.
const monotonicEpoch = () => performance.timeOrigin + performance.now();

const knownMemoryStoreOptions: ReadonlySet<string> = new Set<keyof MemoryStoreOptions>([
  'maxEntries',
  'maxBytes',
  'onEvict',
  'now',
]);

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
  if (options === null || typeof options !== 'object') throw new TypeError('memoryStore takes an options object');
  assertKnownOptions(options, knownMemoryStoreOptions, 'memoryStore');
  const maxEntries = options.maxEntries ?? 100_000;
  if (!Number.isInteger(maxEntries) || maxEntries < 1) throw new TypeError('maxEntries must be a positive integer');
  const maxBytes = options.maxBytes ?? DEFAULT_MAX_BYTES;
  if (!Number.isSafeInteger(maxBytes) || maxBytes < 1) throw new TypeError('maxBytes must be a positive integer');
  const { onEvict } = options;
  if (onEvict !== undefined && typeof onEvict !== 'function') throw new TypeError('onEvict must be a function');
  const now = options.now ?? monotonicEpoch;
  if (typeof now !== 'function') throw new TypeError('now must be a function returning epoch milliseconds');
  let evicted = 0;
  let bytes = 0;
  const entries = new Map<string, Entry>();
  // Every expiry set is appended to the lane of its duration, so the soonest expiries of a lane are
  // found at its head in O(1). (Iterating the Map from its front would walk the tombstones V8 leaves
  // behind deleted entries, which turns eviction quadratic.) Slots of a lane whose entry was removed,
  // moved to another lane or renewed since are skipped.
  const lanes = new Map<number, Lane>();
  // The same lanes in an array: walked on every eviction, where a Map iterator would be garbage.
  const laneList: Lane[] = [];
  let writesSinceSweep = 0;

  const remove = (entry: Entry) => {
    entries.delete(entry.id);
    entry.gone = true;
    bytes -= entry.bytes;
  };

  // Sets what an entry counts against the budget.
  const weigh = (entry: Entry, size: number) => {
    bytes += size - entry.bytes;
    entry.bytes = size;
  };

  const full = () => entries.size > maxEntries || bytes > maxBytes;

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

  // The last lane asked for: a claim and its completion alternate between two durations (the lease
  // and the retention), so most lookups are one of those two and skip the Map.
  let lastMs = Number.NaN;
  let lastLane: Lane | undefined;
  let otherMs = Number.NaN;
  let otherLane: Lane | undefined;
  const laneFor = (ms: number): Lane => {
    if (ms === lastMs) return lastLane as Lane;
    if (ms === otherMs) return otherLane as Lane;
    const lane = findLane(ms);
    otherMs = lastMs;
    otherLane = lastLane;
    lastMs = ms;
    lastLane = lane;
    return lane;
  };

  const findLane = (ms: number): Lane => {
    let lane = lanes.get(ms);
    if (lane !== undefined) return lane;
    if (lanes.size >= maxExactLanes) {
      const rounded = 2 ** Math.ceil(Math.log2(Math.max(ms, 1)));
      lane = lanes.get(rounded);
      if (lane !== undefined) return lane;
      ms = rounded;
    }
    lane = new Lane();
    lanes.set(ms, lane);
    laneList.push(lane);
    return lane;
  };

  // Gives an entry in progress a lease of `ms`: it expires when its lease and its keep have passed.
  // It is filed by its lease's end, in the lane of the lease: a lane holding claims for a lease and
  // a day's keep would keep its head, once abandoned, for a day, and every slot behind it (the entries
  // of every later claim, long gone) with it. When its lease ends it moves on to its keep's lane.
  const lease = (entry: Entry, ms: number, t: number) => {
    entry.expiresAt = t + ms + entry.keepMs;
    entry.inKeepLane = false;
    file(entry, ms);
  };

  // Sets an entry's expiry and files it in the lane of that duration.
  const expireIn = (entry: Entry, ms: number, t: number) => {
    entry.expiresAt = t + ms;
    file(entry, ms);
  };

  // Files an entry in the lane of duration `ms`.
  const file = (entry: Entry, ms: number) => {
    const lane = laneFor(ms);
    if (entry.lane === lane) entry.slots++;
    else {
      entry.lane = lane;
      entry.slots = 1;
    }
    lane.entries.push(entry);
  };

  // The entry at the lane's head if that slot is its current one; a stale slot is dropped.
  const current = (lane: Lane): Entry | undefined => {
    while (lane.head < lane.entries.length) {
      const entry = lane.entries[lane.head] as Entry;
      if (entry.gone || entry.lane !== lane) lane.head++;
      else if (entry.slots > 1) {
        entry.slots--;
        lane.head++;
      } else return entry;
    }
    return undefined;
  };

  // Not on every emptied lane: a lane of leases empties after nearly every request, and truncating
  // its array each time would make V8 reallocate it on the next push.
  const compact = (lane: Lane) => {
    if (lane.head > 1_024 && lane.head * 2 > lane.entries.length) {
      lane.entries = lane.entries.slice(lane.head);
      lane.head = 0;
    }
  };

  // Takes a due entry off its lane's head: gone if its time is up, else (its lease ended unrenewed:
  // abandoned) on to the lane of its keep, due when that ends.
  const due = (lane: Lane, entry: Entry, t: number) => {
    lane.head++;
    entry.lane = undefined;
    if (entry.expiresAt <= t) remove(entry);
    else {
      entry.inKeepLane = true;
      file(entry, entry.keepMs);
    }
  };

  // Takes due entries (and stale slots) off the lane's head, at most `budget` of them.
  const drain = (lane: Lane, t: number, budget: number) => {
    let entry = current(lane);
    while (entry !== undefined && dueAt(entry) <= t && budget-- > 0) {
      due(lane, entry, t);
      entry = current(lane);
    }
    compact(lane);
  };

  // After every claim: a sweep now and then, so memory follows the retention, and room when full.
  const afterClaim = (t: number) => {
    if (++writesSinceSweep >= 64) {
      writesSinceSweep = 0;
      for (let i = 0; i < laneList.length; i++) drain(laneList[i] as Lane, t, 64);
    }
    if (full()) evict(t);
  };

  const evict = (t: number) => {
    while (full()) {
      // One pass over the lanes: drop what has expired at each head (room that costs no retry its
      // replay), and note the completed head nearest the end of its retention.
      let victim: Entry | undefined;
      let from: Lane | undefined;
      for (let i = 0; i < laneList.length; i++) {
        const lane = laneList[i] as Lane;
        let entry = current(lane);
        while (entry !== undefined && dueAt(entry) <= t) {
          due(lane, entry, t);
          entry = current(lane);
        }
        compact(lane);
        if (entry !== undefined && settled(entry, t) && (victim === undefined || entry.expiresAt < victim.expiresAt)) {
          victim = entry;
          from = lane;
        }
      }
      if (!full()) return;
      if (victim !== undefined && from !== undefined) {
        from.head++;
      } else {
        // Every head is in progress (a lane holds both when a lease and a retention are equal, or
        // when durations share a rounded lane): look behind them, moving nothing, so each lane stays
        // in expiry order. Records in progress are never dropped, so the store may grow instead.
        victim = completedBehind(t);
        if (victim === undefined) return;
      }
      remove(victim);
      // One found behind the heads may have expired (a lane is only roughly in expiry order): that
      // is room that costs no retry its replay, so it is neither counted nor reported.
      if (victim.expiresAt <= t) continue;
      evicted++;
      // An observer must never fail the claim that made room.
      if (onEvict) notify(onEvict, { id: victim.id, expiresAt: victim.expiresAt, at: t });
    }
  };

  // The completed (or abandoned) record nearest its end among the first slots behind the lanes'
  // heads; bounded, since this runs on a claim (a full store of live leases grows instead).
  const completedBehind = (t: number): Entry | undefined => {
    let victim: Entry | undefined;
    for (const lane of laneList) {
      const end = Math.min(lane.entries.length, lane.head + 1_024);
      for (let i = lane.head; i < end; i++) {
        const entry = lane.entries[i] as Entry;
        if (entry.gone || entry.lane !== lane || !settled(entry, t)) continue;
        if (victim === undefined || entry.expiresAt < victim.expiresAt) victim = entry;
      }
    }
    return victim;
  };

  return {
    inProcess: true,
    // A response over the whole budget is refused (see complete): declared, so the adapters settle
    // it in advance as one over their own maxResponseBytes (kept, by the default policy, as
    // response_not_replayable) instead of handing it over, whose refusal would release the key and
    // let a retry run the operation again. Refused here by the same measure (see complete).
    maxResponseBytes: maxBytes,
    get size() {
      return entries.size;
    },
    get bytes() {
      return bytes;
    },
    get evicted() {
      return evicted;
    },
    claim({ id, token, fingerprint, leaseMs, keepAfterLeaseMs, replaces }: ClaimInput): ClaimResult {
      const t = now();
      const keepMs = keepAfterLeaseMs ?? 0;
      const existing = live(id, t);
      if (existing) {
        // Only the abandoned record named by the claim is taken over; anything else is answered.
        if (replaces === undefined || existing.completed || leaseEnd(existing) > t || existing.token !== replaces)
          return { claimed: false, record: recordOf(existing, t) };
        existing.token = token;
        existing.fingerprint = fingerprint;
        existing.keepMs = keepMs;
        weigh(existing, sizeOf(id, token, fingerprint));
        lease(existing, leaseMs, t);
        // Another fingerprint may weigh more than the one it replaces (a direct caller's, of any length).
        if (bytes > maxBytes) evict(t);
        return CLAIMED;
      }
      const entry = new Entry(id, token, fingerprint, 0);
      entry.keepMs = keepMs;
      entries.set(id, entry);
      weigh(entry, sizeOf(id, token, fingerprint));
      lease(entry, leaseMs, t);
      afterClaim(t);
      return CLAIMED;
    },
    renew({ id, token, leaseMs }: RenewInput): boolean {
      const t = now();
      const existing = live(id, t);
      if (existing === undefined || existing.completed || existing.token !== token) return false;
      lease(existing, leaseMs, t);
      return true;
    },
    complete({ id, token, response, retentionMs }: CompleteInput): boolean {
      const t = now();
      const existing = live(id, t);
      if (existing === undefined || existing.completed || existing.token !== token) return false;
      // Copies of headers and body: the caller may reuse its objects, and a replay must be the bytes
      // of this moment. Completed in place: the entry moves to its retention's lane.
      const body = response.body;
      // Refused when the response alone is over the budget, measured as the declared cap
      // (`maxResponseBytes`) is measured by those who keep to it: the adapters and makeIdempotent
      // check it in advance and keep the key as unreplayable. Measured here with the record's id,
      // token and fingerprint too, a response just under the declared cap was refused unannounced,
      // its key released, and the retry ran the operation again.
      const responseSize = storedResponseSize(response);
      if (responseSize > maxBytes) throw new ResponseTooLargeError(responseSize, maxBytes);
      // Counted at most as the whole budget: such a record pushes out every other one and stays, a few
      // bytes (its id, token and fingerprint) over what it counts.
      const size = Math.min(maxBytes, sizeOf(id, token, existing.fingerprint, response.headers, body.byteLength));
      existing.completed = true;
      existing.status = response.status;
      existing.headers = { ...response.headers };
      existing.body = Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('latin1');
      expireIn(existing, retentionMs, t);
      weigh(existing, size);
      // Room for what this response added (a count of records alone never grows here).
      if (bytes > maxBytes) evict(t);
      return true;
    },
    release({ id, token }: ReleaseInput): boolean {
      const existing = live(id, now());
      if (existing === undefined || existing.completed || existing.token !== token) return false;
      remove(existing);
      return true;
    },
    // Any state, the token the only fence. `remove` gives back what the record counted against
    // maxEntries and maxBytes; its slot in its lane is skipped as gone, as a release's is.
    forget({ id, token }: ForgetInput): boolean {
      const existing = live(id, now());
      if (existing === undefined || existing.token !== token) return false;
      remove(existing);
      return true;
    },
    get(id: string): StoreRecord | undefined {
      const t = now();
      const entry = live(id, t);
      return entry === undefined ? undefined : recordOf(entry, t);
    },
  };
}
