/**
 * What a DPoP replay memory answers for a proof key: `true` when the key is new (it is now
 * remembered), `false` when it was seen before, `'full'` when it cannot be remembered. The guard
 * refuses the proof on anything but `true`. `'full'` is truthy: compare with `=== true`.
 *
 * @example
 * const answer: ReplayAnswer = seen('jkt:jti', Date.now() + 70_000);
 * if (answer !== true) refuse();
 */
export type ReplayAnswer = boolean | 'full';

interface Remembered {
  expiresAt: number;
  key: string;
}

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
 * was given. When every slot holds a key that has not expired it answers `'full'` rather than forget
 * one: a forgotten key is a proof that can be replayed inside its window, so under a flood the guard
 * refuses new proofs (fails closed) instead. Size it for the proofs one `dpop.maxAge` window brings.
 *
 * @example
 * const seen = memoryReplayCache(1000, Date.now);
 * seen('jkt:jti', Date.now() + 60_000); // true, then false for the same key until it expires
 */
export function memoryReplayCache(
  maxEntries: number,
  now: () => number,
): (key: string, expiresAtMs: number) => ReplayAnswer {
  if (!Number.isSafeInteger(maxEntries) || maxEntries < 1) {
    throw new TypeError('dpop.maxReplayEntries must be a positive integer');
  }
  // The keys remembered now; their expiries live in the heap.
  const entries = new Set<string>();
  // Invariant: one heap item per key in `entries`. A key leaves the set only when its item is popped,
  // and is stored again only after it left, so popping an item always removes exactly its key.
  const heap: Remembered[] = [];
  return (key, expiresAtMs) => {
    const at = now();
    while (heap.length > 0 && (heap[0] as Remembered).expiresAt <= at) {
      entries.delete((popMin(heap) as Remembered).key);
    }
    // Everything left has not expired.
    if (entries.has(key)) return false;
    if (entries.size >= maxEntries) return 'full';
    entries.add(key);
    push(heap, { expiresAt: expiresAtMs, key });
    return true;
  };
}
