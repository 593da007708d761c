// A third-party store, written the way a store author would from docs/stores.md, the `Store` type
// and the testkit README alone: records in a plain JavaScript Map, durations on the store's own
// injectable clock, every method async behind a simulated network hop (as a DynamoDB, MongoDB or
// remote SQL store would be). Each compare-and-set runs its read and its write in one synchronous
// step after the hop, as a server that runs one conditional write atomically does.
//
// `bugs` switches on realistic mistakes, one at a time, to see whether describeStore() notices.
import {
  type AsyncStore,
  assertStoreId,
  assertStoreString,
  type ClaimInput,
  type ClaimResult,
  type CompleteInput,
  type ForgetInput,
  type ReleaseInput,
  type RenewInput,
  ResponseTooLargeError,
  responseLimit,
  type StoredResponse,
  type StoreRecord,
  storedResponseSize,
} from '@idem/core';
import type { StoreHarness } from '@idem/testkit';

export const storeBugs = [
  // Read, then a round trip, then write: two claims of one id can both see it free.
  'racy-claim',
  // A conditional insert for an id never seen (DynamoDB attribute_not_exists, Mongo insertOne on a
  // unique _id: atomic), but a record that is there and expired is read, found expired, and then
  // overwritten with an unconditional put: the classic read-modify-write of an expired item.
  'racy-overwrite-of-expired',
  // complete() checks the state but not the fencing token.
  'complete-ignores-token',
  // renew() checks the token but not the state: it gives a completed record a lease again.
  'renew-ignores-state',
  // A takeover (`replaces`) checks only that the record still holds the named token, not that it is
  // still abandoned: `UPDATE ... WHERE id = ? AND token = ?`, without `AND lease_until <= now`.
  'takeover-checks-token-only',
  // complete() reads the record, checks the token, then writes in a second round trip.
  'racy-complete',
  // Times everything with the application's wall clock (Date.now()) instead of the store's own.
  'wall-clock',
  // renew() sets the new lease but drops the keep (expiry = now + leaseMs).
  'renew-drops-keep',
  // release() checks the token but not the state: it deletes a completed record.
  'release-ignores-state',
  // forget() deletes by id alone (what a plain DEL or `DELETE WHERE id = ?` does): an operator's
  // forget of a record read a while ago deletes the newer claim that took the key over since.
  'forget-ignores-token',
  // complete() copies status, headers and body, and drops the handler's own reason phrase
  // (`statusMessage`): a store written before phrases were kept.
  'drops-status-message',
  // Takes any string as id, token or fingerprint, as a Map can: skips assertStoreString, so it keeps
  // what the Redis and PostgreSQL stores refuse (a NUL, a lone surrogate), and a swap of stores
  // changes which ids are accepted.
  'accepts-any-string',
] as const;
export type StoreBug = (typeof storeBugs)[number];

interface Row {
  state: 'in_progress' | 'completed';
  token: string;
  fingerprint: string;
  /** In progress: the end of the lease (store clock). */
  leaseUntil: number;
  /** The end of the record: lease + keep in progress, retention once completed (store clock). */
  expiresAt: number;
  keepMs: number;
  response?: StoredResponse;
}

export interface MapStoreOptions {
  now: () => number;
  records?: Map<string, Row>;
  maxResponseBytes?: number;
  bug?: StoreBug | undefined;
}

// One network round trip.
const hop = () => new Promise<void>((resolve) => setImmediate(resolve));

const copyResponse = (response: StoredResponse): StoredResponse => ({
  status: response.status,
  headers: { ...response.headers },
  body: new Uint8Array(response.body),
  // The handler's own reason phrase, when it set one: the contract keeps it (StoredResponse.statusMessage).
  ...(response.statusMessage === undefined ? {} : { statusMessage: response.statusMessage }),
});

export function mapStore(options: MapStoreOptions): AsyncStore & { readonly records: Map<string, Row> } {
  const records = options.records ?? new Map<string, Row>();
  const bug = options.bug;
  const clock = bug === 'wall-clock' ? Date.now : options.now;
  const cap =
    options.maxResponseBytes === undefined
      ? undefined
      : responseLimit(options.maxResponseBytes, 2 ** 31, 'maxResponseBytes');

  const live = (id: string, now: number): Row | undefined => {
    const row = records.get(id);
    if (row === undefined) return undefined;
    if (now >= row.expiresAt) {
      records.delete(id);
      return undefined;
    }
    return row;
  };
  // docs/stores.md: every store refuses, before any I/O, an id, token or fingerprint that is not
  // well-formed UTF-16 or holds U+0000 (a Map could keep them; the other stores could not), and an
  // empty id or token.
  const checked = (...strings: [value: unknown, name: string][]) => {
    if (bug === 'accepts-any-string') return;
    for (const [value, name] of strings) {
      if (name === 'fingerprint') assertStoreString(value, name);
      else assertStoreId(value, name);
    }
  };
  const abandoned = (row: Row, now: number) => row.state === 'in_progress' && now >= row.leaseUntil;
  const view = (row: Row, now: number): StoreRecord =>
    row.state === 'completed'
      ? {
          state: 'completed',
          token: row.token,
          fingerprint: row.fingerprint,
          response: copyResponse(row.response as StoredResponse),
        }
      : { state: abandoned(row, now) ? 'abandoned' : 'in_progress', token: row.token, fingerprint: row.fingerprint };
  const fresh = (input: ClaimInput, now: number): Row => {
    const keepMs = input.keepAfterLeaseMs ?? 0;
    return {
      state: 'in_progress',
      token: input.token,
      fingerprint: input.fingerprint,
      leaseUntil: now + input.leaseMs,
      expiresAt: now + input.leaseMs + keepMs,
      keepMs,
    };
  };

  const store = {
    records,
    ...(cap === undefined ? {} : { maxResponseBytes: cap }),

    async claim(input: ClaimInput): Promise<ClaimResult> {
      checked([input.id, 'id'], [input.token, 'token'], [input.fingerprint, 'fingerprint']);
      if (input.replaces !== undefined) checked([input.replaces, 'replaces']);
      await hop();
      if (bug === 'racy-claim') {
        const seen = live(input.id, clock());
        await hop();
        if (seen === undefined) {
          records.set(input.id, fresh(input, clock()));
          return { claimed: true };
        }
      }
      if (bug === 'racy-overwrite-of-expired' && records.has(input.id)) {
        // The conditional insert failed: an item is there. Read it, and if it is expired, put ours.
        const seen = records.get(input.id) as Row;
        if (clock() >= seen.expiresAt) {
          await hop();
          records.set(input.id, fresh(input, clock()));
          return { claimed: true };
        }
      }
      const now = clock();
      const row = live(input.id, now);
      if (row === undefined) {
        records.set(input.id, fresh(input, now));
        return { claimed: true };
      }
      const mayTakeOver =
        input.replaces !== undefined &&
        input.replaces === row.token &&
        (bug === 'takeover-checks-token-only' || abandoned(row, now));
      if (mayTakeOver) {
        records.set(input.id, fresh(input, now));
        return { claimed: true };
      }
      return { claimed: false, record: view(row, now) };
    },

    async renew(input: RenewInput): Promise<boolean> {
      checked([input.id, 'id'], [input.token, 'token']);
      await hop();
      const now = clock();
      const row = live(input.id, now);
      if (row === undefined || row.token !== input.token) return false;
      if (row.state !== 'in_progress' && bug !== 'renew-ignores-state') return false;
      row.leaseUntil = now + input.leaseMs;
      row.expiresAt = now + input.leaseMs + (bug === 'renew-drops-keep' ? 0 : row.keepMs);
      return true;
    },

    async complete(input: CompleteInput): Promise<boolean> {
      checked([input.id, 'id'], [input.token, 'token']);
      if (cap !== undefined) {
        const bytes = storedResponseSize(input.response);
        if (bytes > cap) throw new ResponseTooLargeError(bytes, cap);
      }
      const { statusMessage: _dropped, ...withoutPhrase } = input.response;
      const response = copyResponse(bug === 'drops-status-message' ? withoutPhrase : input.response);
      await hop();
      const row = live(input.id, clock());
      if (row === undefined || row.state !== 'in_progress') return false;
      if (row.token !== input.token && bug !== 'complete-ignores-token') return false;
      if (bug === 'racy-complete') await hop();
      const now = clock();
      records.set(input.id, {
        state: 'completed',
        token: input.token,
        fingerprint: row.fingerprint,
        leaseUntil: now,
        expiresAt: now + input.retentionMs,
        keepMs: 0,
        response,
      });
      return true;
    },

    async release(input: ReleaseInput): Promise<boolean> {
      checked([input.id, 'id'], [input.token, 'token']);
      await hop();
      const row = live(input.id, clock());
      if (row === undefined || row.token !== input.token) return false;
      if (row.state !== 'in_progress' && bug !== 'release-ignores-state') return false;
      records.delete(input.id);
      return true;
    },

    // Optional in the contract: any state, fenced on the token alone.
    async forget(input: ForgetInput): Promise<boolean> {
      checked([input.id, 'id'], [input.token, 'token']);
      await hop();
      const row = live(input.id, clock());
      if (row === undefined || (row.token !== input.token && bug !== 'forget-ignores-token')) return false;
      records.delete(input.id);
      return true;
    },

    async get(id: string): Promise<StoreRecord | undefined> {
      checked([id, 'id']);
      await hop();
      const now = clock();
      const row = live(id, now);
      return row === undefined ? undefined : view(row, now);
    },
  };
  return store;
}

/**
 * The describeStore() harness a store author writes from the testkit README: the store on a clock
 * the test drives, so nothing sleeps. `expire` moves the clock past any lease or retention (as the
 * README's example does), `advance` enables the duration checks, `endLease` the abandoned-record
 * checks, `makeCapped` the size cap checks, `reopen` the read by a store made afresh.
 */
export function mapStoreHarness(bug?: StoreBug): StoreHarness {
  let now = 1_000_000;
  const clock = () => now;
  const store = mapStore({ now: clock, bug });
  return {
    store,
    expire: async () => {
      now += 400 * 86_400_000;
    },
    advance: async (ms) => {
      now += ms;
    },
    endLease: async (_id, leaseMs) => {
      now += leaseMs;
    },
    makeCapped: (maxBytes) => mapStore({ now: clock, records: store.records, maxResponseBytes: maxBytes, bug }),
    reopen: () => mapStore({ now: clock, records: store.records, bug }),
  };
}
