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
import { assertStoreId, assertStoreString } from './store-strings.js';
import { ResponseTooLargeError, sizeOverLimit } from './stored-response.js';

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

// When the lease of an entry in progress ends: its expiry less its keep. Not a field of its own: a
// time is a heap number in V8, one more object per record for the collector to copy.
const leaseEnd = (entry: Entry): number => entry.expiresAt - entry.keepMs;

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
  /** The handler's own reason phrase, if it set one (see `StoredResponse.statusMessage`). */
  statusMessage: string | undefined = undefined;
  headers: Record<string, string> | undefined = undefined;
  /** The body as a Latin-1 string, one byte per character: one plain heap object, cheapest to keep. */
  body = '';
  /**
   * While in progress: how long it stays, abandoned, after its lease ends (at `expiresAt - keepMs`),
   * carried over by renewals.
   */
  keepMs = 0;
  /** The lane or heap where it was last filed: a slot anywhere else is stale (see `current`). */
  filed: Lane | Heap | undefined = undefined;

  constructor(
    readonly id: string,
    public token: string,
    public fingerprint: string,
    public expiresAt: number,
  ) {}
}

/**
 * The slots filed for one duration (a lease of 10 s, a retention of 24 h), each entry with the time
 * it is due then (`keys`), soonest first: a slot joins the tail only when it is due no sooner than
 * the one before (the clock only moves forward, so one duration's slots nearly always arrive in
 * order); any other goes to its timeline's heap. So a lane's head is its soonest slot, and a claim
 * and its completion cost an append each. One queue for all durations would not do: a record kept
 * 1 h behind one kept 24 h would outlive its retention there.
 */
class Lane {
  entries: Entry[] = [];
  keys: number[] = [];
  head = 0;
  /** The key of the last slot appended: the latest in the lane. */
  last = Number.NEGATIVE_INFINITY;
}

/**
 * The slots that could not join a lane in order (an abandoned record filed in its keep's lane after
 * records completed since, or durations past the lanes' count): a binary min-heap on `keys`, its
 * stale slots dropped when they come to the top.
 */
class Heap {
  entries: Entry[] = [];
  keys: number[] = [];
}

/**
 * Entries by the time they are due, in lanes by duration and a heap for the rest: the live leases,
 * due when their lease ends, or the settled records (completed, or abandoned: their lease ran out
 * unrenewed), due when they expire. Apart, so that the soonest slot of every settled lane is a
 * record that may be evicted: a live lease is never in the way of the record nearest its end.
 */
class Timeline {
  readonly lanes = new Map<number, Lane>();
  /** The same lanes in an array: walked on every eviction, where a Map iterator would be garbage. */
  readonly list: Lane[] = [];
  readonly heap = new Heap();
  /** The last lane asked for: most filings in a row are for one duration, and skip the Map. */
  lastMs = Number.NaN;
  lastLane: Lane | undefined = undefined;
  constructor(readonly leases: boolean) {}
}

// Lanes past this many durations, per timeline: beyond it, durations go to the heap (a store fed
// computed retentions must not grow a lane per record, and every eviction looks at each lane).
const maxLanes = 32;

// When an entry is due in a timeline: a lease when it ends, a settled record when it expires.
const dueIn = (timeline: Timeline, entry: Entry): number => (timeline.leases ? leaseEnd(entry) : entry.expiresAt);

// Whether a slot (an entry, due at `key`, in `where`) is the entry's current one. An entry refiled
// since (renewed, completed, abandoned, taken over) or removed leaves stale slots behind. Its key
// tells the slots of one lane apart: an entry that leaves a lane and comes back (a lease, a renewal
// of another length, a takeover with the first) has an older slot there, ahead of its place.
const isCurrent = (timeline: Timeline, where: Lane | Heap, entry: Entry, key: number): boolean =>
  entry.filed === where && !entry.gone && dueIn(timeline, entry) === key;

function heapPush(heap: Heap, entry: Entry, key: number) {
  const { entries, keys } = heap;
  let i = keys.length;
  entries.push(entry);
  keys.push(key);
  while (i > 0) {
    const parent = (i - 1) >> 1;
    if ((keys[parent] as number) <= key) break;
    keys[i] = keys[parent] as number;
    entries[i] = entries[parent] as Entry;
    i = parent;
  }
  keys[i] = key;
  entries[i] = entry;
}

function heapPop(heap: Heap) {
  const { entries, keys } = heap;
  const key = keys.pop() as number;
  const entry = entries.pop() as Entry;
  const n = keys.length;
  if (n === 0) return;
  let i = 0;
  for (;;) {
    let child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && (keys[child + 1] as number) < (keys[child] as number)) child++;
    if ((keys[child] as number) >= key) break;
    keys[i] = keys[child] as number;
    entries[i] = entries[child] as Entry;
    i = child;
  }
  keys[i] = key;
  entries[i] = entry;
}

// The entry at the lane's head if that slot is its current one; stale slots are dropped.
function current(timeline: Timeline, lane: Lane): Entry | undefined {
  const { entries, keys } = lane;
  while (lane.head < entries.length) {
    const entry = entries[lane.head] as Entry;
    if (isCurrent(timeline, lane, entry, keys[lane.head] as number)) return entry;
    lane.head++;
  }
  return undefined;
}

// The entry at the top of the heap if that slot is its current one; stale slots are dropped.
function top(timeline: Timeline): Entry | undefined {
  const heap = timeline.heap;
  while (heap.keys.length > 0) {
    const entry = heap.entries[0] as Entry;
    if (isCurrent(timeline, heap, entry, heap.keys[0] as number)) return entry;
    heapPop(heap);
  }
  return undefined;
}

// Not on every emptied lane: a lane of leases empties after nearly every request, and truncating
// its arrays each time would make V8 reallocate them on the next push.
function compact(lane: Lane) {
  if (lane.head > 1_024 && lane.head * 2 > lane.entries.length) {
    lane.entries = lane.entries.slice(lane.head);
    lane.keys = lane.keys.slice(lane.head);
    lane.head = 0;
  }
}

function laneFor(timeline: Timeline, ms: number): Lane | undefined {
  if (ms === timeline.lastMs) return timeline.lastLane;
  let lane = timeline.lanes.get(ms);
  if (lane === undefined) {
    if (timeline.list.length >= maxLanes) return undefined;
    lane = new Lane();
    timeline.lanes.set(ms, lane);
    timeline.list.push(lane);
  }
  timeline.lastMs = ms;
  timeline.lastLane = lane;
  return lane;
}

// Files an entry in the timeline, with a duration of `ms`: at its lane's tail when it is due no
// sooner than the lane's last slot, else in the heap.
function file(timeline: Timeline, entry: Entry, ms: number) {
  const key = dueIn(timeline, entry);
  const lane = laneFor(timeline, ms);
  if (lane !== undefined && key >= lane.last) {
    lane.entries.push(entry);
    lane.keys.push(key);
    lane.last = key;
    entry.filed = lane;
  } else {
    heapPush(timeline.heap, entry, key);
    entry.filed = timeline.heap;
  }
}

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
          ...(entry.statusMessage === undefined ? {} : { statusMessage: entry.statusMessage }),
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
  // Live leases, and the records that may be dropped to make room (completed or abandoned): never
  // a live lease, which would let a second execution run beside it. An entry is in one at a time.
  const leases = new Timeline(true);
  const settled = new Timeline(false);
  let writesSinceSweep = 0;

  const remove = (entry: Entry) => {
    entries.delete(entry.id);
    entry.gone = true;
    bytes -= entry.bytes;
    // Its slots stay in the lanes until their due time (skipped as gone), and hold the entry till
    // then: its body and headers go now, as `bytes` says they did (a forgotten record's body would
    // otherwise stay for up to its retention).
    entry.body = '';
    entry.headers = undefined;
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

  // Gives an entry in progress a lease of `ms`: it expires when its lease and its keep have passed.
  // It is filed by its lease's end, with the leases: once that has passed unrenewed, it moves on to
  // the settled records, filed by its expiry (see `lapse`).
  const lease = (entry: Entry, ms: number, t: number) => {
    entry.expiresAt = t + ms + entry.keepMs;
    file(leases, entry, ms);
  };

  // A slot taken off a timeline, due: a settled record has expired and goes; a lease has ended
  // unrenewed, and its record goes too if its keep has passed, else it is abandoned, due when the
  // keep ends (in the keep's lane if it comes in order there, else in the heap).
  const lapse = (timeline: Timeline, entry: Entry, t: number) => {
    if (timeline.leases && entry.expiresAt > t) file(settled, entry, entry.keepMs);
    else remove(entry);
  };

  // Takes the due slots (and the stale ones before them) off every lane and the heap of a timeline,
  // at most `budget` of them from each.
  const drain = (timeline: Timeline, t: number, budget: number) => {
    const { list, heap } = timeline;
    for (let i = 0; i < list.length; i++) {
      const lane = list[i] as Lane;
      let left = budget;
      let entry = current(timeline, lane);
      while (entry !== undefined && (lane.keys[lane.head] as number) <= t && left-- > 0) {
        lane.head++;
        lapse(timeline, entry, t);
        entry = current(timeline, lane);
      }
      compact(lane);
    }
    let left = budget;
    let entry = top(timeline);
    while (entry !== undefined && (heap.keys[0] as number) <= t && left-- > 0) {
      heapPop(heap);
      lapse(timeline, entry, t);
      entry = top(timeline);
    }
  };

  // After every claim: a sweep now and then, so memory follows the retention, and room when full.
  const afterClaim = (t: number) => {
    if (++writesSinceSweep >= 64) {
      writesSinceSweep = 0;
      drain(leases, t, 64);
      drain(settled, t, 64);
    }
    if (full()) evict(t);
  };

  // Makes room in the documented order: every expired record first, whatever its duration, then the
  // settled record nearest its end, one at a time. Each lane is in order and the heap's top is its
  // soonest, so the soonest of all is among the lanes' heads and the top: one look at each.
  const evict = (t: number) => {
    // Every lease that has ended is settled first (or gone, its keep over too): an abandoned record
    // waiting there would be passed over.
    drain(leases, t, Number.POSITIVE_INFINITY);
    const { list, heap } = settled;
    while (full()) {
      let victim: Entry | undefined;
      let from: Lane | undefined;
      let soonest = Number.POSITIVE_INFINITY;
      for (let i = 0; i < list.length; i++) {
        const lane = list[i] as Lane;
        const entry = current(settled, lane);
        if (entry !== undefined && (lane.keys[lane.head] as number) < soonest) {
          victim = entry;
          from = lane;
          soonest = lane.keys[lane.head] as number;
        }
      }
      const topEntry = top(settled);
      if (topEntry !== undefined && (heap.keys[0] as number) < soonest) {
        victim = topEntry;
        from = undefined;
      }
      // Only live leases left: records in progress are never dropped, so the store grows instead.
      if (victim === undefined) return;
      if (from === undefined) heapPop(heap);
      else {
        from.head++;
        compact(from);
      }
      remove(victim);
      // An expired record is room that costs no retry its replay: neither counted nor reported.
      if (victim.expiresAt <= t) continue;
      evicted++;
      // An observer must never fail the claim that made room.
      if (onEvict) notify(onEvict, { id: victim.id, expiresAt: victim.expiresAt, at: t });
    }
  };

  // The answer of a call that found no record of its own, which checks its strings (store-strings.ts)
  // here, off the hot path: a call that found its record holds an id and a token equal to those its
  // claim checked. So a malformed one is refused with a TypeError as in every store, and the calls
  // that find their record (nearly all of them) pay nothing for it.
  const miss = (id: string, token: string): false => {
    assertStoreId(id, 'id');
    assertStoreId(token, 'token');
    return false;
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
      // Refused as the Redis and PostgreSQL stores refuse them (store-strings.ts): this store could
      // keep them, but a swap of stores must not change which strings are accepted. The token and
      // fingerprint are new on every path; the id only where no record holds it (see `miss`).
      assertStoreId(token, 'token');
      assertStoreString(fingerprint, 'fingerprint');
      if (replaces !== undefined) assertStoreId(replaces, 'replaces');
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
      assertStoreId(id, 'id');
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
      if (existing === undefined || existing.completed || existing.token !== token) return miss(id, token);
      lease(existing, leaseMs, t);
      return true;
    },
    complete({ id, token, response, retentionMs }: CompleteInput): boolean {
      const t = now();
      const existing = live(id, t);
      if (existing === undefined || existing.completed || existing.token !== token) return miss(id, token);
      // Copies of headers and body: the caller may reuse its objects, and a replay must be the bytes
      // of this moment. Completed in place: the entry moves to its retention's lane.
      const body = response.body;
      // Refused when the response alone is over the budget, measured as the declared cap
      // (`maxResponseBytes`) is measured by those who keep to it: the adapters and makeIdempotent
      // check it in advance and keep the key as unreplayable. Measured here with the record's id,
      // token and fingerprint too, a response just under the declared cap was refused unannounced,
      // its key released, and the retry ran the operation again.
      const responseSize = sizeOverLimit(response, maxBytes);
      if (responseSize !== undefined) throw new ResponseTooLargeError(responseSize, maxBytes);
      // Counted at most as the whole budget: such a record pushes out every other one and stays, a few
      // bytes (its id, token and fingerprint) over what it counts.
      const reason = response.statusMessage;
      const size = Math.min(
        maxBytes,
        sizeOf(id, token, existing.fingerprint, response.headers, body.byteLength + (reason?.length ?? 0)),
      );
      existing.completed = true;
      existing.status = response.status;
      existing.statusMessage = reason;
      existing.headers = { ...response.headers };
      existing.body = Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('latin1');
      existing.expiresAt = t + retentionMs;
      file(settled, existing, retentionMs);
      weigh(existing, size);
      // Room for what this response added (a count of records alone never grows here).
      if (bytes > maxBytes) evict(t);
      return true;
    },
    release({ id, token }: ReleaseInput): boolean {
      const existing = live(id, now());
      if (existing === undefined || existing.completed || existing.token !== token) return miss(id, token);
      remove(existing);
      return true;
    },
    // Any state, the token the only fence. `remove` gives back what the record counted against
    // maxEntries and maxBytes; its slot in its lane is skipped as gone, as a release's is.
    forget({ id, token }: ForgetInput): boolean {
      const existing = live(id, now());
      if (existing === undefined || existing.token !== token) return miss(id, token);
      remove(existing);
      return true;
    },
    get(id: string): StoreRecord | undefined {
      const t = now();
      const entry = live(id, t);
      if (entry !== undefined) return recordOf(entry, t);
      assertStoreId(id, 'id');
      return undefined;
    },
  };
}
