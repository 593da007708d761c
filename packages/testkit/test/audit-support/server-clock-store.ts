// A third-party store whose records live "on a server" with a clock of its own, as a SQL or
// key-value store's do: the harness reads a record's `ttl` against that server clock (as SQL's
// `expires_at - now()` or Redis `PTTL` would), never the application's `Date`. It is the Map store of
// map-store.ts, on that server clock, with store-author bugs that only a store behind a network
// (one whose harness gives `ttl`, not `advance`) can have. Each variant is what a store author wrote
// from docs/stores.md and the Store type:
//
// - 'app-clock': leases and retention are timed with the application's `Date.now()` (a SQL store
//   that binds `new Date(Date.now() + leaseMs)` as `expires_at`), not the server's clock. The
//   contract: "Durations are relative; a store never trusts the application's wall clock."
// - 'complete-keeps-longer-expiry': complete() sets the record's end to the later of the end it
//   had (lease + keep) and now + retentionMs (`expires_at = GREATEST(expires_at, now() + ?)`, to
//   "never shorten a record"). The contract: "A completed record lives `retentionMs`". An outcome
//   policy with a shorter retention for some outcomes (a 5xx kept a minute) then replays it for the
//   engine's whole retention, since the engine's claims keep a crashed attempt that long.
import type { StoreHarness } from '@idem/testkit';
import { mapStore } from './map-store.js';

export const serverClockBugs = ['app-clock', 'complete-keeps-longer-expiry'] as const;
export type ServerClockBug = (typeof serverClockBugs)[number];

// The server's clock: the real time, which no mock of the application's `Date` reaches (the bound
// original is kept, whatever replaces `Date` or `Date.now` later).
const serverNow = Date.now.bind(Date);

export function serverClockHarness(bug?: ServerClockBug): StoreHarness {
  // The application's clock, read at each call (as `new Date()` in a SQL parameter would be).
  const clock = bug === 'app-clock' ? () => Date.now() : serverNow;
  const store = mapStore({ now: clock });
  const { records } = store;
  if (bug === 'complete-keeps-longer-expiry') {
    const complete = store.complete.bind(store);
    store.complete = async (input) => {
      const before = records.get(input.id)?.expiresAt ?? 0;
      const done = await complete(input);
      const row = records.get(input.id);
      if (done && row !== undefined) row.expiresAt = Math.max(before, row.expiresAt);
      return done;
    };
  }
  return {
    store,
    expire: async (id) => {
      const row = records.get(id);
      if (row !== undefined) {
        row.expiresAt = serverNow() - 1;
        row.leaseUntil = Math.min(row.leaseUntil, row.expiresAt);
      }
    },
    ttl: async (id) => {
      const row = records.get(id);
      return row === undefined ? undefined : row.expiresAt - serverNow();
    },
    endLease: async (id) => {
      const row = records.get(id);
      if (row === undefined) return;
      row.leaseUntil = serverNow();
      row.expiresAt = row.leaseUntil + row.keepMs;
    },
    makeCapped: (maxBytes) => mapStore({ now: clock, records, maxResponseBytes: maxBytes }),
    reopen: () => mapStore({ now: clock, records }),
  };
}
