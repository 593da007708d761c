/**
 * What a DPoP replay memory answers for a proof key: `true` when the key is new (it is now
 * remembered), `false` when it was seen before, `'full'` when it cannot be remembered because the
 * memory is full, `'share-full'` when the memory could take it but the proof's key (the `jkt` before
 * the first `:`) already holds its share. The guard refuses the proof on anything but `true`.
 * `'full'` and `'share-full'` are truthy: compare with `=== true`.
 *
 * @example
 * const answer: ReplayAnswer = seen('jkt:jti', Date.now() + 70_000);
 * if (answer !== true) refuse();
 */
export type ReplayAnswer = boolean | 'full' | 'share-full';

interface Remembered {
  expiresAt: number;
  key: string;
  /** The part of `key` its share is counted under, kept so a pop need not parse the key again. */
  owner: string;
}

/** A key's owner: what precedes its first `:`, the proof key's thumbprint in the guard's `jkt:jti`. */
function ownerOf(key: string): string {
  const colon = key.indexOf(':');
  return colon === -1 ? key : key.slice(0, colon);
}

/**
 * The share one proof key gets when none is given: a hundredth of the memory, at least 1. Past half
 * of the memory it takes fifty more keys, so tokens the issuer bound to distinct keys, to fill it;
 * one key then still gets about 14 proofs a second with the defaults (1,000 per 70 s a proof is
 * remembered), and below half as many as it sends.
 */
const defaultShareOf = (maxEntries: number): number => Math.max(1, Math.floor(maxEntries / 100));

// A binary min-heap on `expiresAt`. Proofs do not expire in the order they arrive (each expiry follows
// its own proof's iat), so insertion order alone would hide expired keys behind a live one; the heap
// finds every expired key in O(log n) each, without scanning the memory on every insert.
function push(heap: Remembered[], item: Remembered): void {
  let index = heap.push(item) - 1;
  while (index > 0) {
    const parent = (index - 1) >> 1;
    if ((heap[parent] as Remembered).expiresAt <= item.expiresAt) break;
    heap[index] = heap[parent] as Remembered;
    index = parent;
  }
  heap[index] = item;
}

function popMin(heap: Remembered[]): Remembered | undefined {
  const top = heap[0];
  const last = heap.pop();
  if (top === undefined || last === undefined || heap.length === 0) return top;
  let index = 0;
  for (;;) {
    const left = 2 * index + 1;
    if (left >= heap.length) break;
    const right = left + 1;
    const child =
      right < heap.length && (heap[right] as Remembered).expiresAt < (heap[left] as Remembered).expiresAt
        ? right
        : left;
    if ((heap[child] as Remembered).expiresAt >= last.expiresAt) break;
    heap[index] = heap[child] as Remembered;
    index = child;
  }
  heap[index] = last;
  return top;
}

/**
 * An in-process DPoP replay memory holding at most `maxEntries` proof keys, each until the time it
 * was given, and at most `maxEntriesPerKey` of them under one owner (the part of the key before its
 * first `:`: the proof key's thumbprint, as the guard's keys are `jkt:jti`). When every slot holds a
 * key that has not expired it answers `'full'` rather than forget one: a forgotten key is a proof that
 * can be replayed inside its window, so under a flood the guard refuses new proofs (fails closed)
 * instead. The share is what keeps that flood from being one client's to cause: once the memory is
 * half full, a key holding its share gets `'share-full'` for its new proofs, so a holder of one bound
 * token sending fresh proofs as fast as it can leaves at least half of the memory to everyone else;
 * below half, no key is held back. Size it for the proofs one `dpop.maxAge` window brings; the share
 * defaults to a hundredth of it.
 *
 * @example
 * const seen = memoryReplayCache(1000, Date.now, 50);
 * seen('jkt:jti', Date.now() + 60_000); // true, then false for the same key until it expires
 */
export function memoryReplayCache(
  maxEntries: number,
  now: () => number,
  maxEntriesPerKey?: number,
): (key: string, expiresAtMs: number) => ReplayAnswer {
  if (!Number.isSafeInteger(maxEntries) || maxEntries < 1) {
    throw new TypeError('dpop.maxReplayEntries must be a positive integer');
  }
  const share = maxEntriesPerKey ?? defaultShareOf(maxEntries);
  if (!Number.isSafeInteger(share) || share < 1) {
    throw new TypeError('dpop.maxReplayEntriesPerKey must be a positive integer');
  }
  // A share above the whole would read as a bound and be none; equal to it is the way to have none.
  if (share > maxEntries) {
    throw new TypeError(`dpop.maxReplayEntriesPerKey (${share}) must be at most dpop.maxReplayEntries (${maxEntries})`);
  }
  // The share holds once the memory is half full. Below that every key gets in, so a single busy
  // client is never held back while there is room; above it a key past its share is refused, so
  // however many proofs one key sends, at least half of the memory stays for the others.
  const pressure = Math.ceil(maxEntries / 2);
  // The keys remembered now; their expiries live in the heap.
  const entries = new Set<string>();
  // How many live keys each owner holds; an owner is deleted at zero, so this map never holds more
  // owners than `entries` holds keys and stays inside the memory bound.
  const held = new Map<string, number>();
  // Invariant: one heap item per key in `entries`, and `held` counts those items by owner. A key
  // leaves the set (and its owner's count drops) only when its item is popped, and is stored again
  // only after it left, so popping an item always removes exactly its key.
  const heap: Remembered[] = [];
  return (key, expiresAtMs) => {
    const at = now();
    while (heap.length > 0 && (heap[0] as Remembered).expiresAt <= at) {
      const gone = popMin(heap) as Remembered;
      entries.delete(gone.key);
      const left = (held.get(gone.owner) ?? 1) - 1;
      if (left === 0) held.delete(gone.owner);
      else held.set(gone.owner, left);
    }
    // Everything left has not expired. A replay is a replay whatever the share: checked first.
    if (entries.has(key)) return false;
    const owner = ownerOf(key);
    const count = held.get(owner) ?? 0;
    // The memory's bound before the owner's: where both hold, everyone is being refused and `'full'`
    // is what the operator must hear; and a share equal to the memory (no share) answers as before.
    if (entries.size >= maxEntries) return 'full';
    if (count >= share && entries.size >= pressure) return 'share-full';
    entries.add(key);
    held.set(owner, count + 1);
    push(heap, { expiresAt: expiresAtMs, key, owner });
    return true;
  };
}
