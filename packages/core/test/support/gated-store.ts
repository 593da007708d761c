import { memoryStore, type Store } from '../../src/index.js';

/**
 * A shared store (not in this process) whose first claim waits until the test lets it answer: the
 * window a real Redis or PostgreSQL round trip leaves between the request and the capture. Counts
 * renewals, so a test can tell a settled key from one the heartbeat keeps renewing.
 */
export function gatedStore() {
  const inner = memoryStore();
  let claimed!: () => void;
  const claiming = new Promise<void>((resolve) => {
    claimed = resolve;
  });
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  let renewals = 0;
  let onRenew: (() => void) | undefined;
  const store: Store = {
    inProcess: false,
    async claim(input) {
      claimed();
      await gate;
      return inner.claim(input);
    },
    async renew(input) {
      renewals++;
      onRenew?.();
      return inner.renew(input);
    },
    async complete(input) {
      return inner.complete(input);
    },
    async release(input) {
      return inner.release(input);
    },
    async get(id) {
      return inner.get(id);
    },
  };
  return {
    store,
    inner,
    claiming,
    open,
    renewals: () => renewals,
    // Resolves after `n` more renewals.
    renewed(n: number) {
      const target = renewals + n;
      return new Promise<void>((resolve) => {
        onRenew = () => {
          if (renewals >= target) resolve();
        };
      });
    },
  };
}

/** The events that settle a claim one way or the other. */
export const settledTypes: ReadonlySet<string> = new Set(['complete', 'release', 'not-stored', 'lease-lost']);

/**
 * Whether the claim of `gated` settles (`'settled'`: one of {@link settledTypes} shows in `events`)
 * before the heartbeat renews it three more times (`'renewed'`: a key held for as long as the
 * process lives).
 *
 * @example
 * expect(await settledOrRenewed(gated, events)).toBe('settled');
 */
export async function settledOrRenewed(
  gated: ReturnType<typeof gatedStore>,
  events: readonly { type: string }[],
): Promise<'settled' | 'renewed'> {
  let check: ReturnType<typeof setInterval> | undefined;
  return Promise.race([
    new Promise<'settled'>((resolve) => {
      check = setInterval(() => {
        if (events.some((event) => settledTypes.has(event.type))) resolve('settled');
      }, 5);
    }),
    gated.renewed(3).then(() => 'renewed' as const),
  ]).finally(() => clearInterval(check));
}
