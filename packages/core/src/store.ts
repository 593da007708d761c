/**
 * The Store contract: what a backend must do for the engine to give exactly one execution per key.
 *
 * Rules every store follows (checked by `describeStore()` in @idem/testkit):
 * - `claim` is one atomic step: of N concurrent claims of an absent (or expired) id, exactly one wins.
 * - A record in progress holds its lease for `leaseMs`, measured by the store's own clock, and stays
 *   `keepAfterLeaseMs` longer as an abandoned record when nobody renews it (its holder crashed). An
 *   abandoned record is answered to a claim as `{ state: 'abandoned' }`, with its token and
 *   fingerprint, so the engine can refuse a request with other parameters (spec part 3, rule 2); a
 *   claim that names its token in `replaces` takes it over with a new token: that is crash recovery.
 *   Once `keepAfterLeaseMs` has passed too, the id is unseen again.
 * - `renew`, `complete` and `release` are compare-and-set on the fencing token: with a token that is not
 *   the record's current one (the lease was lost and someone else took over) they change nothing and
 *   resolve to `false`. An abandoned record's holder still holds its token until someone takes over:
 *   its late `complete` stores the outcome (the work is done; a takeover would only run it again), and
 *   its `renew` gives it a lease again.
 * - A completed record lives `retentionMs` (store clock), then the id is unseen again.
 * - `forget`, optional, deletes a record in any state, fenced on the token as `release` is: an
 *   operator's way out of a wrongly stored outcome that would otherwise replay for the retention.
 * - Durations are relative; a store never trusts the application's wall clock.
 * - Infrastructure failures reject with an error (ideally `StoreUnavailableError`: only it, or no
 *   answer within `storeTimeout`, lets `storeUnavailable: 'fail-open'` run a request unprotected;
 *   a store that answered, refusing the command or too contended to settle a claim
 *   (`StoreContendedError`), rejects with another error); expected outcomes (lost race, stale token)
 *   are values.
 * - Response bodies are bytes and come back byte for byte.
 * - Ids, tokens and fingerprints come back, and are told apart, exactly as given. A string no
 *   store could keep so (not well-formed UTF-16: a lone surrogate has no UTF-8 form, and the pg and
 *   Redis drivers send it as U+FFFD; or holding U+0000, which PostgreSQL `text` cannot hold) every
 *   store refuses with a `TypeError`, before any I/O, in every method: `assertStoreString` checks
 *   one. The engine never sends one (its ids are SHA-256 digests); a direct caller may.
 * - `complete` (and a transactional store's commit) may take the response's shape as given: the
 *   engine runs `assertStoredResponse` on every response before any store sees it, so a status
 *   outside 100–599, headers that are not a plain object of HTTP field values, or a body that is not
 *   a `Uint8Array` never reach a store (nor a header value or reason phrase with U+0000 or a
 *   surrogate: field values are characters up to U+00FF). A direct caller runs it itself. A store
 *   with a size cap refuses, before it writes anything, a response over it with
 *   `ResponseTooLargeError`, measured as `storedResponseSize` measures it.
 * - Any method may answer with a value instead of a promise (the memory store does): callers `await`
 *   the result, and the engine skips the await, and the microtask it costs, when there is nothing to
 *   wait for. A store that answers synchronously reports failures by throwing.
 */
export interface Store {
  /** Atomically claims `id` for a new execution, or returns the live record that holds it. */
  claim(input: ClaimInput): Awaitable<ClaimResult>;
  /**
   * Sets a live lease held by `token` to `leaseMs` from now, shorter than what is left too (the
   * caller chooses the lease). False when the token is no longer current.
   */
  renew(input: RenewInput): Awaitable<boolean>;
  /** Stores the outcome and moves the record to completed. False when the token is no longer current. */
  complete(input: CompleteInput): Awaitable<boolean>;
  /** Deletes an in-progress record held by `token`, so a retry runs. False when the token is no longer current. */
  release(input: ReleaseInput): Awaitable<boolean>;
  /**
   * Optional, for operators (the engine never calls it): deletes the record `id` if it holds
   * `token`, whatever its state (completed, in progress or abandoned), so the next claim runs afresh.
   * It is how a wrongly stored outcome (a 500 stored during an outage) is forgotten before its
   * retention ends. True when it deleted the record; false when the record is gone (never claimed,
   * expired, forgotten) or holds another token. The token is the fence: a record that expired and
   * was claimed again since the operator read it has a new token, and a forget never removes that
   * newer claim. A record in progress is freed as `release` frees it: its holder's later `renew`
   * and `complete` are refused.
   */
  forget?(input: ForgetInput): Awaitable<boolean>;
  /**
   * Reads the live record (an abandoned one as such), or `undefined` when the id is unseen (never
   * claimed, released, or expired).
   */
  get(id: string): Awaitable<StoreRecord | undefined>;
  /**
   * True for stores whose operations never wait on I/O (the memory store): the engine then skips
   * its per-operation time limit, which costs more than such an operation.
   */
  readonly inProcess?: boolean;
  /**
   * The largest response `complete` accepts, measured by `storedResponseSize`, for a store with a size
   * cap (a bigger one it refuses with `ResponseTooLargeError`). The HTTP layer reads it to know in
   * advance that a response cannot be stored, and settles it as one over its own `maxResponseBytes`.
   */
  readonly maxResponseBytes?: number;
}

/**
 * A {@link Store} whose every method answers with a promise, as any store behind a network does.
 * The Redis and PostgreSQL stores are typed this way, so their callers can chain on the results.
 */
export interface AsyncStore extends Store {
  claim(input: ClaimInput): Promise<ClaimResult>;
  renew(input: RenewInput): Promise<boolean>;
  complete(input: CompleteInput): Promise<boolean>;
  release(input: ReleaseInput): Promise<boolean>;
  forget?(input: ForgetInput): Promise<boolean>;
  get(id: string): Promise<StoreRecord | undefined>;
}

/** A value now, or a promise of it later. */
export type Awaitable<T> = T | Promise<T>;

/** True when `value` is a promise (or any thenable) that must be awaited. */
export function isPending<T>(value: Awaitable<T>): value is Promise<T> {
  return typeof (value as { then?: unknown } | null | undefined)?.then === 'function';
}

/** A response as stored and replayed. Header names are lower case. */
export interface StoredResponse {
  status: number;
  headers: Record<string, string>;
  body: Uint8Array;
  /**
   * The reason phrase of the status line, only when the handler set one of its own (`201 Created
   * Fine`); absent for the status's default phrase, and over HTTP/2, which has none. A store keeps
   * it when given and returns it with the record; a record without it (written by an older version,
   * or by a store that does not keep it) replays the default phrase.
   */
  statusMessage?: string | undefined;
}

/**
 * A live record as a store returns it. `abandoned` is a record in progress whose lease ran out with
 * nobody renewing it: its holder most likely crashed, and the work may have run in part.
 */
export type StoreRecord =
  | { state: 'in_progress'; token: string; fingerprint: string }
  | { state: 'abandoned'; token: string; fingerprint: string }
  | { state: 'completed'; token: string; fingerprint: string; response: StoredResponse };

export interface ClaimInput {
  /** The record id: a hash of scope, operation and key, safe to use in any store key. */
  id: string;
  /** The new fencing token. */
  token: string;
  /** The request fingerprint, stored for comparison on repeats. */
  fingerprint: string;
  /** How long the claim lives without renewal, in milliseconds, measured by the store. */
  leaseMs: number;
  /**
   * How long the record stays, abandoned, after its lease runs out with nobody renewing it, in
   * milliseconds (store clock); every renewal carries it over. The engine passes its retention: a
   * crashed attempt's fingerprint is kept as long as a finished one's would be. Absent or 0: the id
   * is unseen as soon as the lease runs out (a store that does not keep abandoned records at all
   * stays safe, only laxer: a request with other parameters then runs as a fresh one).
   */
  keepAfterLeaseMs?: number;
  /**
   * The token of an abandoned record (as a claim or `get` answered it) that this claim takes over.
   * The store takes it over only if the record is still abandoned and still holds that token; else it
   * answers as to any claim. Without it, a claim of an abandoned record is answered with the record.
   */
  replaces?: string;
}

export type ClaimResult = { claimed: true } | { claimed: false; record: StoreRecord };

export interface RenewInput {
  id: string;
  token: string;
  leaseMs: number;
}

export interface CompleteInput {
  id: string;
  token: string;
  response: StoredResponse;
  /** How long the completed record is kept, in milliseconds, measured by the store. */
  retentionMs: number;
}

export interface ReleaseInput {
  id: string;
  token: string;
}

/** What {@link Store.forget} takes: the record and the token it must still hold (as `get` read it). */
export interface ForgetInput {
  id: string;
  token: string;
}
