import type { IdempotencyError } from './errors.js';
import type { Outcome } from './outcome-policy.js';
import type { StoredResponse } from './store.js';
import type { StoreUnavailablePolicy } from './store-unavailable.js';

// The engine's public types: what begin takes, the lease it gives, and what each call answers.

/** What {@link IdempotencyEngine.begin} needs to know about a request. */
export interface BeginInput {
  /** The client's (or server-minted) idempotency key, already parsed. */
  key: string;
  /** Who is calling: the authenticated principal. Different scopes never share a record. */
  scope: string;
  /** What is being done, e.g. `POST /charges`. The same key on another operation is another record. */
  operation: string;
  /** The request fingerprint, or `''` to skip the comparison. Stored as a SHA-256: a hex digest as given, any other text hashed. */
  fingerprint?: string | undefined;
  /**
   * The same request's fingerprints under earlier ways of computing it (a rolling change of what the
   * fingerprint covers: the HTTP layer's `fingerprint.previous`), each taken as `fingerprint` is.
   * Called at most once, and only when a record's fingerprint does not match `fingerprint`: a record
   * that matches one of them is this request, made under the earlier settings (replayed, or taken
   * over with its own fingerprint kept, so instances of those settings still match it). `''` among
   * them matches nothing.
   */
  alternateFingerprints?: (() => readonly string[] | undefined) | undefined;
  /** `'fail-open'`: answer `unprotected` when the first claim cannot reach the store. See {@link StoreUnavailablePolicy}. */
  storeUnavailable?: StoreUnavailablePolicy | undefined;
}

/** A claim on a key: hold it while the handler runs, then `complete` or `release` it. */
export interface Lease {
  readonly id: string;
  readonly key: string;
  readonly scope: string;
  readonly operation: string;
  /** The fencing token: only the holder of the current token can complete or release the record. */
  readonly token: string;
  readonly fingerprint: string;
  readonly startedAt: number;
  /**
   * Aborted when the lease is lost: a renewal refused, or none confirmed for a whole lease (counted
   * from the last confirmed one's sending, even while a renewal is still unanswered), or `maxExecution`.
   * With `heartbeat: false` nothing renews or watches the lease: only a takeover by another request
   * of this process aborts it.
   */
  readonly signal: AbortSignal;
  /** True once the lease is known to be lost. */
  readonly lost: boolean;
  /**
   * True when this claim took the key over from an attempt whose lease ran out unrenewed (its
   * process crashed or hung), with the same parameters: that attempt may have done part of the work,
   * so a handler with effects outside a transaction may want to look for them first.
   */
  readonly recovered: boolean;
}

/** The outcome of {@link IdempotencyEngine.begin}. */
export type BeginResult =
  | { kind: 'execute'; lease: Lease }
  | { kind: 'replay'; response: StoredResponse }
  | { kind: 'reject'; error: IdempotencyError };

/** What `begin` also answers when asked with `storeUnavailable`: under `'fail-open'`, the store could not be reached, and nothing was claimed. */
export type UnprotectedResult = { kind: 'unprotected' };

/** The outcome of {@link IdempotencyEngine.complete}. */
export type CompleteResult =
  | { ok: true; stored: boolean }
  | { ok: false; reason: 'lease-lost' | 'store-error'; error?: unknown };

/** The outcome of {@link IdempotencyEngine.release}. */
export type ReleaseResult = { ok: true } | { ok: false; reason: 'lease-lost' | 'store-error'; error?: unknown };

/** The outcome of {@link IdempotencyEngine.transaction}. */
export type TransactionResult<T> =
  | { committed: true; value: T; stored: boolean }
  | { committed: false; reason: 'lease-lost' | 'store-error'; error?: unknown };

/** The idempotency engine: one per service, shared by every request. */
export interface IdempotencyEngine {
  // `unprotected` is among the answers unless the call cannot be asking for 'fail-open': a policy
  // passed on from an optional setting (`StoreUnavailablePolicy | undefined`) may be it.
  begin(input: BeginInput & { storeUnavailable?: 'fail-closed' | undefined }): Promise<BeginResult>;
  begin(input: BeginInput): Promise<BeginResult | UnprotectedResult>;
  /**
   * Stores `response` per the outcome policy (or releases the key when the policy says so). The
   * policy sees `outcome`, with the response's status unless `outcome.status` says otherwise.
   */
  complete(lease: Lease, response: StoredResponse, outcome?: Partial<Outcome>): Promise<CompleteResult>;
  /** Forgets the claim so that a retry runs. */
  release(lease: Lease): Promise<ReleaseResult>;
  /**
   * Transactional mode (stores that support it, such as PostgreSQL): runs `fn` in one transaction
   * that also completes the record, so the handler's writes and the stored outcome commit together or
   * not at all. If the lease was lost, nothing of `fn` commits. If `fn` throws, or left the
   * transaction aborted (the store rejects with `TransactionAbortedError`: a statement of `fn`'s
   * failed and it went on without a SAVEPOINT, or a deferred constraint refused its writes at
   * COMMIT), everything rolls back and the error is rethrown with
   * the lease still held: release it, or store an error outcome, as for any failed handler.
   */
  transaction<T, Tx = unknown>(
    lease: Lease,
    fn: (tx: Tx) => Promise<{ value: T; response: StoredResponse; outcome?: Partial<Outcome> }>,
  ): Promise<TransactionResult<T>>;
  /** True when the store supports {@link IdempotencyEngine.transaction}. */
  readonly transactional: boolean;
  /** The resolved settings, in milliseconds. */
  readonly settings: Readonly<{
    retentionMs: number;
    leaseMs: number;
    waitMs: number;
    storeTimeoutMs: number;
    /** 0 when off. */
    maxExecutionMs: number;
    /** Seconds in `Retry-After` on 503. */
    unavailableRetryAfter: number;
    /**
     * The store's own cap on a stored response (`store.maxResponseBytes`), when it declares one: a
     * larger one is refused by the store and the key released, so a caller that must never run twice
     * checks its result against it first (as the HTTP adapters and {@link makeIdempotent} do).
     */
    storeMaxResponseBytes: number | undefined;
  }>;
}
