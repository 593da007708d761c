import { randomBytes } from 'node:crypto';
import { createDeadlines, StoreTimeoutError } from './deadlines.js';
import { type SettleNow, settleNow } from './engine-hooks.js';
import { engineSettings, type IdempotencyOptions, knownEngineOptions } from './engine-options.js';
import { completedRecord, replayCacheOf } from './engine-replay-cache.js';
import type {
  BeginInput,
  BeginResult,
  CompleteResult,
  IdempotencyEngine,
  Lease,
  ReleaseResult,
  TransactionResult,
  UnprotectedResult,
} from './engine-types.js';
import { IdempotencyError, isIdempotencyError, isStoreUnavailableError, isTransactionAbortedError } from './errors.js';
import type { IdempotencyEvent } from './events.js';
import { LeaseState } from './lease-state.js';
import { leaseWatch } from './lease-watch.js';
import { notify } from './notify.js';
import { assertKnownOptions } from './option-names.js';
import { outcomeDecisions } from './outcome-decisions.js';
import type { Outcome } from './outcome-policy.js';
import { outcomePolls } from './outcome-polls.js';
import { unreadableRecord } from './record-check.js';
import { Alternates, keptFingerprint, sameRequest, storableFingerprint } from './record-fingerprint.js';
import { recordId } from './record-id.js';
import {
  type Awaitable,
  type ClaimInput,
  type ClaimResult,
  type CompleteInput,
  isPending,
  type Store,
  type StoredResponse,
  type StoreRecord,
} from './store.js';
import { assertStoredResponse, isResponseTooLargeError } from './stored-response.js';
import { isTransactionalStore, type TransactionalStore } from './transactional.js';

// Results that carry no data are shared: a fresh object per call is garbage the collector must chase.
const STORED: CompleteResult = Object.freeze({ ok: true, stored: true });
const NOT_STORED: CompleteResult = Object.freeze({ ok: true, stored: false });
const RELEASED: ReleaseResult = Object.freeze({ ok: true });
const LEASE_LOST = Object.freeze({ ok: false, reason: 'lease-lost' }) as CompleteResult & ReleaseResult;

/**
 * Creates the idempotency engine: the state machine of spec part 3 over any {@link Store}.
 *
 * @example
 * const engine = createIdempotency({ store: memoryStore() });
 * const started = await engine.begin({ key, scope: 'user:42', operation: 'POST /charges', fingerprint });
 * if (started.kind === 'execute') {
 *   const response = await runHandler();
 *   await engine.complete(started.lease, response);
 * }
 */
export function createIdempotency(options: IdempotencyOptions): IdempotencyEngine {
  if (!options || typeof options !== 'object') throw new TypeError('createIdempotency needs an options object');
  assertKnownOptions(options, knownEngineOptions, 'createIdempotency');
  return engineFrom(options);
}

/**
 * {@link createIdempotency} for a caller that checked the option names itself (the HTTP layer's
 * options hold its own names too).
 */
export function engineFrom(options: IdempotencyOptions): IdempotencyEngine {
  const {
    store,
    retentionMs,
    leaseMs,
    waitMs,
    storeTimeoutMs,
    mismatchStatus,
    policy,
    heartbeat,
    perLease,
    maxExecutionMs,
    conflictRetryAfter,
    unavailableRetryAfter,
    now,
    elapsed,
    retryPause,
    onEvent,
  } = engineSettings(options);
  const replays = replayCacheOf(options.replayCache, store.inProcess === true);

  // Leases this process holds right now. A second request for the same record in this process is
  // answered without a store round trip: the hot-key case costs nothing.
  const held = new Map<string, LeaseState>();
  // Fencing tokens only need to be unique (they never leave the server), so a random per-engine
  // nonce plus a counter does, at a fraction of the cost of a UUID per claim.
  // A store in this process only needs tokens unique among the engines that share it: 24 random bits
  // and a counter keep the token under 13 characters, where V8 makes one flat string instead of a
  // chain of concatenations; the store keeps that string as long as the record, and every garbage
  // collection until then copies it. A store other processes share gets 96 random bits.
  const inProcess = store.inProcess === true;
  const tokenPrefix = inProcess ? randomBytes(3).toString('base64url') : `${randomBytes(12).toString('base64url')}.`;
  let tokenSequence = 0;

  // An observer must never break a request, whether it throws or rejects.
  const emit = (event: IdempotencyEvent) => notify(onEvent, event);

  const withTimeout: <T>(operation: string, work: () => T | Promise<T>) => Promise<T> =
    store.inProcess === true ? async (_operation, work) => work() : createDeadlines(storeTimeoutMs, elapsed);

  const unavailable = (cause: unknown) =>
    new IdempotencyError('store_unavailable', 'The idempotency store could not be reached; retry with the same key.', {
      retryAfter: unavailableRetryAfter,
      cause,
    });

  const conflict = () =>
    new IdempotencyError(
      'in_progress',
      'The first request with this key is still in progress; retry later with the same key.',
      {
        retryAfter: conflictRetryAfter,
      },
    );

  const mismatch = () =>
    mismatchStatus === 400
      ? new IdempotencyError('idempotency_error', 'This key was already used with different request parameters.', {
          status: 400,
        })
      : new IdempotencyError('fingerprint_mismatch', 'This key was already used with different request parameters.');

  const { startHeartbeat, stopHeartbeat, markLost, checkLease } = leaseWatch({
    store,
    held,
    leaseMs,
    heartbeat,
    perLease,
    maxExecutionMs,
    inProcess,
    conflictRetryAfter,
    elapsed,
    withTimeout,
    onEvent,
    emit,
    now,
  });

  // A claim given up on (503: its storeTimeout passed) may still be waiting for the store, in a full
  // pool's queue or a busy Redis, and land later for nobody: it would hold the key for a lease (the
  // client's retry, told nothing ran, would get 409), then be taken over as a crashed attempt though
  // nothing ran. If it lands, it is withdrawn at once, as a run with no effect is (`letGo`).
  const withdrawLateClaim = (input: ClaimInput, call: Promise<ClaimResult>) => {
    call.then(
      (late) => {
        if (late.claimed)
          Promise.resolve(giveBack(input.id, input.token, input.replaces !== undefined)).catch(() => {});
      },
      () => {},
    );
  };

  const waitForOutcome = outcomePolls({ store, withTimeout, elapsed });

  // `phase`: the store call that answered `record`, for the event of a record that cannot be read.
  const settle = (
    operation: string,
    fingerprint: string,
    alternates: Alternates | undefined,
    id: string,
    record: StoreRecord,
    started: number,
    phase: 'claim' | 'get',
    cached = false,
  ): BeginResult | undefined => {
    // Not from the cache: what it holds was checked when it was read. A shared store may hold a
    // record another version or a hand-rolled tool wrote; replayed, its response would fail in
    // writeHead (see record-check.ts), and nothing may run under its key either.
    const broken = cached ? undefined : unreadableRecord(record);
    if (broken !== undefined) {
      if (onEvent) emit({ type: 'store-error', id, operation, phase, error: broken, at: now() });
      return { kind: 'reject', error: unavailable(broken) };
    }
    if (record.state === 'completed') {
      // Read from the store: good for the cache's time (a hit from the cache is not kept longer).
      if (replays !== undefined && !cached) replays.set(id, record, elapsed());
      if (!sameRequest(record.fingerprint, fingerprint, alternates)) {
        if (onEvent) emit({ type: 'mismatch', id, operation, at: now(), durationMs: elapsed() - started });
        return { kind: 'reject', error: mismatch() };
      }
      if (onEvent) {
        const status = record.response.status;
        const durationMs = elapsed() - started;
        emit({ type: 'replay', id, operation, status, at: now(), durationMs, ...(cached ? { cached } : {}) });
      }
      return { kind: 'replay', response: record.response };
    }
    // A crashed attempt's parameters are kept like a finished one's: other parameters are refused
    // (spec part 3, rule 2), the same ones take the key over (the caller claims it with `replaces`).
    if (record.state === 'abandoned' && !sameRequest(record.fingerprint, fingerprint, alternates)) {
      if (onEvent) emit({ type: 'mismatch', id, operation, at: now(), durationMs: elapsed() - started });
      return { kind: 'reject', error: mismatch() };
    }
    return undefined;
  };

  // The claim, completion and release of every request. An in-process store answers at once and
  // cannot hang on a network: it is called without the deadline wrapper, and when it answers with a
  // value rather than a promise the caller awaits nothing (`isPending`). Both are a measurable share
  // of a whole cycle.
  const storeCall = <T>(operation: string, work: () => Awaitable<T>): Awaitable<T> =>
    inProcess ? work() : withTimeout(operation, work);

  const begin = async (raw: BeginInput): Promise<BeginResult | UnprotectedResult> => {
    if (!raw || typeof raw.key !== 'string' || raw.key.length === 0) throw new TypeError('begin needs a non-empty key');
    const { key, scope, operation } = raw;
    if (typeof scope !== 'string') throw new TypeError('begin needs a scope (the authenticated caller)');
    if (typeof operation !== 'string' || operation.length === 0) throw new TypeError('begin needs an operation');
    const fingerprint = storableFingerprint(raw.fingerprint);
    const ask = raw.alternateFingerprints;
    if (ask !== undefined && typeof ask !== 'function')
      throw new TypeError('begin needs alternateFingerprints as a function returning fingerprints, or none');
    const alternates = ask === undefined ? undefined : new Alternates(ask);
    const id = recordId(scope, operation, key);
    const started = elapsed();
    const deadline = started + waitMs;
    if (replays !== undefined) {
      const known = replays.get(id, started);
      if (known !== undefined)
        return settle(operation, fingerprint, alternates, id, known, started, 'get', true) as BeginResult;
    }

    // The token of an abandoned record with this request's parameters, once one was seen: the next
    // claim takes it over (a crashed attempt is run again, as its retry would have been).
    let replaces: string | undefined;
    // The fingerprint the claim writes: a takeover keeps the record's (see keptFingerprint).
    let kept = fingerprint;
    // Only a first claim may fail open: after it, a record was seen under the key (see StoreUnavailablePolicy).
    let first = true;
    for (;;) {
      // In flight in this very process and renewed within one lease: no need to ask the store.
      // A lease that stopped renewing (crashed handler, heartbeat off) falls through to the store.
      // (An in-process store answers as fast as this map, and the same: no lookup on its behalf.)
      const local = inProcess ? undefined : held.get(id);
      // (One not renewed within a lease stays in `held` until a claim of ours takes the key over:
      // then it is marked lost, so its signal aborts.)
      if (local !== undefined && elapsed() - local.lastRenewedAt < leaseMs) {
        if (waitMs === 0 && !local.lost) {
          if (onEvent) emit({ type: 'conflict', id, operation, at: now(), durationMs: elapsed() - started });
          return { kind: 'reject', error: conflict() };
        }
      }
      const token = tokenPrefix + (++tokenSequence).toString(36);
      let claimed: ClaimResult;
      const input: ClaimInput = { id, token, fingerprint: kept, leaseMs, keepAfterLeaseMs: retentionMs };
      if (replaces !== undefined) input.replaces = replaces;
      let call: Awaitable<ClaimResult> | undefined;
      // The lease this claim gets is set no earlier than now: its renewals, its end as the engine
      // watches it and `maxExecution` count from here, not from when `begin` started, which may be
      // a whole `wait` ago (a key taken over after its crashed holder's lease ran out): dated from
      // there, the new lease would be born past its end, its signal aborted before its handler ran.
      const claimSent = elapsed();
      try {
        const answer = storeCall('claim', () => {
          call = store.claim(input);
          return call;
        });
        claimed = isPending(answer) ? await answer : answer;
      } catch (error) {
        // Only a store that could not be reached (its own StoreUnavailableError, or no answer within
        // storeTimeout): one that answered with another error (a table never migrated, a missing
        // grant) was reached, and running unprotected would hide the mistake for as long as it lasts.
        const open =
          first &&
          local === undefined &&
          raw.storeUnavailable === 'fail-open' &&
          (isStoreUnavailableError(error) || error instanceof StoreTimeoutError);
        if (onEvent)
          emit({
            type: 'store-error',
            id,
            operation,
            phase: 'claim',
            error,
            at: now(),
            ...(open && { unprotected: true as const }),
          });
        if (call !== undefined && isPending(call)) withdrawLateClaim(input, call);
        return open ? { kind: 'unprotected' } : { kind: 'reject', error: unavailable(error) };
      }
      first = false;
      if (claimed.claimed) {
        // A lease of this process on the same record (stalled past its lease, or hung without a
        // heartbeat) has lost the key to this claim: say so, so its signal aborts now rather than
        // when its complete or release finds its token gone.
        const previous = held.get(id);
        if (previous !== undefined) markLost(previous, 'taken-over');
        const lease = new LeaseState(id, key, scope, operation, token, kept, now(), claimSent);
        if (checkLease !== undefined) lease.check = checkLease;
        if (replaces !== undefined) lease.recovered = true;
        held.set(id, lease);
        startHeartbeat(lease);
        if (onEvent)
          emit({
            type: 'claim',
            id,
            operation,
            at: now(),
            durationMs: elapsed() - started,
            ...(replaces !== undefined ? { recovered: true as const } : {}),
          });
        return { kind: 'execute', lease };
      }

      const settled = settle(operation, fingerprint, alternates, id, claimed.record, started, 'claim');
      if (settled) return settled;
      if (claimed.record.state === 'abandoned') {
        // A store that answers the very record it was asked to take over did not take it over (it
        // predates `replaces`): answer as for a key in progress rather than ask it again forever.
        if (claimed.record.token === replaces) {
          if (onEvent) emit({ type: 'conflict', id, operation, at: now(), durationMs: elapsed() - started });
          return { kind: 'reject', error: conflict() };
        }
        replaces = claimed.record.token;
        kept = keptFingerprint(fingerprint, claimed.record.fingerprint);
        continue;
      }

      // In progress elsewhere.
      if (elapsed() >= deadline) {
        if (onEvent) emit({ type: 'conflict', id, operation, at: now(), durationMs: elapsed() - started });
        return { kind: 'reject', error: conflict() };
      }
      let record: StoreRecord | undefined;
      try {
        record = await waitForOutcome(id, deadline);
      } catch (error) {
        if (onEvent) emit({ type: 'store-error', id, operation, phase: 'get', error, at: now() });
        return { kind: 'reject', error: unavailable(error) };
      }
      if (record !== undefined) {
        const done = settle(operation, fingerprint, alternates, id, record, started, 'get');
        if (done) return done;
        if (record.state === 'abandoned') {
          replaces = record.token;
          kept = keptFingerprint(fingerprint, record.fingerprint);
          continue;
        }
        if (elapsed() >= deadline) {
          if (onEvent) emit({ type: 'conflict', id, operation, at: now(), durationMs: elapsed() - started });
          return { kind: 'reject', error: conflict() };
        }
      }
      // The key was released or its lease expired: try to claim it ourselves.
    }
  };

  const { retentionFor, keptAtLeastAsSuccess, decide } = outcomeDecisions({
    options,
    policy,
    retentionMs,
    onEvent,
    emit,
    now,
  });

  // Release and completion answer with a value when the store did (an in-process store): the HTTP
  // layer then ends the response in the same tick, with no promise per request. The public
  // `release` and `complete` wrap them in a promise.
  const releaseNow = (lease: Lease): Awaitable<ReleaseResult> => {
    const state = lease as LeaseState;
    stopHeartbeat(state);
    const started = onEvent ? elapsed() : 0;
    let answer: Awaitable<boolean>;
    try {
      answer = storeCall('release', () => letGo(state));
    } catch (error) {
      return releaseFailed(lease, error);
    }
    return isPending(answer)
      ? answer.then(
          (released) => afterRelease(state, started, released),
          (error) => releaseFailed(lease, error),
        )
      : afterRelease(state, started, answer);
  };

  // Frees a key whose run had no effect. A recovered run leaves it as it found it: abandoned, with the
  // crashed attempt's fingerprint (that attempt may have had effects, so other parameters must still
  // be refused), its lease ended at once so the next retry takes it over. Deleting it would let
  // other parameters run. On a store that keeps no abandoned records this is a release.
  const letGo = (lease: LeaseState): Awaitable<boolean> => giveBack(lease.id, lease.token, lease.recovered);

  // The same for a claim known by its id and token (a late one, see `withdrawLateClaim`): a takeover
  // of an abandoned record ends its lease at once (`endLease`), a fresh claim is deleted.
  const giveBack = (id: string, token: string, recovered: boolean): Awaitable<boolean> =>
    recovered ? store.renew({ id, token, leaseMs: 1 }) : store.release({ id, token });

  // Ends a lease at once and keeps its record, abandoned, with its fingerprint: the same request
  // takes it over, other parameters are still refused.
  const endLease = (lease: LeaseState): Awaitable<boolean> => giveBack(lease.id, lease.token, true);

  const afterRelease = (lease: LeaseState, started: number, released: boolean): ReleaseResult => {
    if (!released) {
      markLost(lease, 'fenced');
      return LEASE_LOST;
    }
    if (onEvent)
      emit({ type: 'release', id: lease.id, operation: lease.operation, at: now(), durationMs: elapsed() - started });
    return RELEASED;
  };

  const releaseFailed = (lease: Lease, error: unknown): ReleaseResult => {
    if (onEvent)
      emit({ type: 'store-error', id: lease.id, operation: lease.operation, phase: 'release', error, at: now() });
    return { ok: false, reason: 'store-error', error };
  };

  const completeNow = (
    lease: Lease,
    response: StoredResponse,
    outcome?: Partial<Outcome>,
    keep = false,
  ): Awaitable<CompleteResult> => {
    const state = lease as LeaseState;
    if (!state || typeof state.token !== 'string') throw new TypeError('complete needs the lease returned by begin');
    if (state.lost && outcome?.thrown === true) return settleAsCrash(state, outcome.status ?? response.status);
    const decision = keep ? keptAtLeastAsSuccess(lease.operation) : decide(response, outcome, lease);
    if (!decision.store) {
      const released = releaseNow(lease);
      const status = outcome?.status ?? response.status;
      return isPending(released)
        ? released.then((result) => notStored(lease, status, result))
        : notStored(lease, status, released);
    }
    stopHeartbeat(state);
    // Only events report durations: no clock read without an observer.
    const started = onEvent ? elapsed() : 0;
    try {
      // Here, once, for every store: a response no store could keep or no replay could write is
      // refused before any store sees it, and handled as a store's refusal is (event, key released).
      assertStoredResponse(response);
    } catch (error) {
      return completeFailed(lease, error);
    }
    const input: CompleteInput = { id: lease.id, token: lease.token, response, retentionMs: decision.retentionMs };
    let answer: Awaitable<boolean>;
    try {
      answer = storeCall('complete', () => store.complete(input));
    } catch (error) {
      return completeFailed(lease, error, input);
    }
    return isPending(answer)
      ? answer.then(
          (completed) => afterComplete(state, response, started, completed),
          (error) => completeFailed(lease, error, input),
        )
      : afterComplete(state, response, started, answer);
  };

  // A handler that threw after its lease was lost (its signal aborted: maxExecution, or renewals that
  // failed for a whole lease) most likely stopped on that signal, as the guides ask, before its
  // effect. Stored, its error would answer every retry for the retention and the operation would
  // never run. It is settled as a crash instead: the lease ends at once and the record stays
  // abandoned with this attempt's fingerprint (other parameters still refused), so the same request
  // takes it over and runs. If someone already took the key over, the store refuses and the result
  // is fenced as any late one.
  const settleAsCrash = (lease: LeaseState, status: number): Promise<CompleteResult> => {
    stopHeartbeat(lease);
    return withTimeout('release', () => endLease(lease)).then(
      (ended) => (ended ? notStored(lease, status, RELEASED) : LEASE_LOST),
      // As when a policy's release fails: the store-error event, then not-stored.
      (error) => notStored(lease, status, releaseFailed(lease, error)),
    );
  };

  const notStored = (lease: Lease, status: number, released: ReleaseResult): CompleteResult => {
    if (onEvent) emit({ type: 'not-stored', id: lease.id, operation: lease.operation, status, at: now() });
    return released.ok ? NOT_STORED : released;
  };

  const afterComplete = (
    lease: LeaseState,
    response: StoredResponse,
    started: number,
    completed: boolean,
  ): CompleteResult => {
    if (!completed) {
      // Someone else holds the record now: a late finisher must never overwrite it.
      markLost(lease, 'fenced');
      return LEASE_LOST;
    }
    replays?.set(lease.id, completedRecord(lease, response), elapsed());
    if (onEvent)
      emit({
        type: 'complete',
        id: lease.id,
        operation: lease.operation,
        status: response.status,
        at: now(),
        durationMs: elapsed() - started,
        executionMs: elapsed() - lease.begunAt,
      });
    return STORED;
  };

  const completeFailed = (lease: Lease, error: unknown, input?: CompleteInput): CompleteResult => {
    reportCompleteError(lease, error);
    // The handler ran, so its outcome is what a retry must get: a store that failed once (a pool with
    // no free connection in time, a dropped connection) is asked again in the background, a few
    // times, while the key stays held (a retry meanwhile gets 409, then the replay). Only a response
    // the store refuses for what it is (too large, not storable) is not worth asking again.
    if (input !== undefined && !inProcess && !isResponseTooLargeError(error) && !(error instanceof TypeError)) {
      retryCompletion(lease as LeaseState, input, 0);
    } else {
      freeKey(lease as LeaseState);
    }
    return { ok: false, reason: 'store-error', error };
  };

  const reportCompleteError = (lease: Lease, error: unknown) => {
    if (onEvent)
      emit({ type: 'store-error', id: lease.id, operation: lease.operation, phase: 'complete', error, at: now() });
  };

  // An outcome that will not be stored: the key is freed so a retry is not refused with 409 until the
  // lease runs out. In the background: the store just failed, and waiting for a second timeout would
  // only delay the response the client is owed. If this fails too, the lease ends it.
  const freeKey = (lease: LeaseState) => {
    void withTimeout('release', () => letGo(lease)).catch(() => undefined);
  };

  // Tries a failed completion again after 100 ms, 200 ms, 400 ms, 800 ms and 1.6 s, the lease renewed
  // in between (so the key is not abandoned to a retry that would run the handler again). After the
  // last failure the key is freed as before; if even that fails, the lease ends it. A lease lost
  // meanwhile for good (another execution took the key over) ends the attempts: the late outcome
  // would be fenced anyway. (Tests may shorten the pauses: see completionRetryPauses.)
  const retryCompletion = (lease: LeaseState, input: CompleteInput, attempt: number) => {
    // While the completion was out (no renewals meanwhile) the key may have gone to another claim of
    // this process: its lease is the one `held` renews. Put back over it, this one would push it out
    // of the heartbeat (then be dropped when fenced), and that run's lease would end under its
    // handler for a third run to take the key over. This outcome would be fenced anyway.
    const holder = held.get(lease.id);
    if (holder !== undefined && holder !== lease) {
      markLost(lease, 'taken-over');
      return;
    }
    lease.finished = false;
    lease.retrying = true;
    held.set(lease.id, lease);
    startHeartbeat(lease);
    const timer = setTimeout(() => {
      if (lease.finished) return;
      stopHeartbeat(lease);
      const started = onEvent ? elapsed() : 0;
      let answer: Awaitable<boolean>;
      try {
        answer = storeCall('complete', () => store.complete(input));
      } catch (error) {
        answer = Promise.reject(error);
      }
      Promise.resolve(answer).then(
        (completed) => {
          if (completed) afterComplete(lease, input.response, started, true);
          else settleRefusedRetry(lease, input, started);
        },
        (error: unknown) => {
          reportCompleteError(lease, error);
          if (attempt + 1 < completionRetries) retryCompletion(lease, input, attempt + 1);
          else freeKey(lease);
        },
      );
    }, retryPause(attempt));
    timer.unref?.();
  };

  const completionRetries = 5;

  // A retried completion the store refused. The attempt before it was given up on, not known to have
  // failed: one that timed out may have landed after all, and a store that answers only for a record
  // in progress (PostgreSQL's UPDATE) then refuses its own outcome. Reported as fenced, that outcome
  // would read as a late finisher refused for another execution's, which never ran. The record says
  // which: completed under this claim's token (no other claim has it) is this very outcome.
  const settleRefusedRetry = (lease: LeaseState, input: CompleteInput, started: number) => {
    withTimeout('get', () => store.get(input.id)).then(
      (record) => {
        const landed = record !== undefined && record.state === 'completed' && record.token === input.token;
        afterComplete(lease, input.response, started, landed);
      },
      () => afterComplete(lease, input.response, started, false),
    );
  };

  const release = async (lease: Lease): Promise<ReleaseResult> => {
    // As `completeNow` does: anything but a lease would fail deep in the store with a property error.
    const state = lease as LeaseState | undefined;
    if (!state || typeof state.token !== 'string') throw new TypeError('release needs the lease returned by begin');
    return releaseNow(lease);
  };

  const complete = async (
    lease: Lease,
    response: StoredResponse,
    outcome?: Partial<Outcome>,
  ): Promise<CompleteResult> => completeNow(lease, response, outcome);

  const transaction = async <T, Tx>(
    lease: Lease,
    fn: (tx: Tx) => Promise<{ value: T; response: StoredResponse; outcome?: Partial<Outcome> }>,
  ): Promise<TransactionResult<T>> => {
    if (!isTransactionalStore(store)) throw new TypeError('this store does not support transactions');
    const state = lease as LeaseState;
    const started = elapsed();
    let stored = false;
    let status = 0;
    let committedResponse: StoredResponse | undefined;
    // A failure of the handler itself is rethrown after the rollback with the lease still held, so
    // the caller can store its error outcome or release per policy; only store failures end here.
    let handlerError: { error: unknown } | undefined;
    // The transaction must begin (a connection, BEGIN) within storeTimeout, as every other store call
    // a request waits for (a pool whose connections are all held would otherwise keep it waiting
    // for as long as they are); the handler inside it then takes as long as it takes. One that
    // begins after its caller gave up runs nothing and rolls back at once.
    let gaveUp = false;
    let signalBegun = () => {};
    const begun = new Promise<void>((resolve) => {
      signalBegun = resolve;
    });
    try {
      const running = (store as TransactionalStore<Tx>).transaction(
        { id: lease.id, token: lease.token },
        async (tx) => {
          if (gaveUp) throw new Error('the transaction began after its caller gave up');
          signalBegun();
          let produced: Awaited<ReturnType<typeof fn>>;
          try {
            produced = await fn(tx);
          } catch (error) {
            handlerError = { error };
            throw error;
          }
          const { value, response, outcome } = produced;
          const decision = decide(response, outcome, lease);
          stored = decision.store;
          status = response.status;
          committedResponse = response;
          // The store now completes the record and commits. Renewing meanwhile means nothing: in
          // PostgreSQL a renewal waits on the row the completion holds, then finds it completed and
          // answers false, which would report a lost lease and abort the signal as the commit lands.
          stopHeartbeat(state);
          // Thrown here, inside the transaction, it rolls back the handler's writes with the outcome,
          // as a store's refusal at commit would.
          if (decision.store) assertStoredResponse(response);
          return { value, response: decision.store ? response : undefined, retentionMs: decision.retentionMs };
        },
      );
      try {
        // (The race holds on to `running`: a rejection after a timeout is never unhandled.)
        await withTimeout('transaction', () => Promise.race([begun, running]));
      } catch (error) {
        // Not begun in time, or failed: either way nothing of it is left to wait for. (A handler's
        // own failure is rethrown below as such.)
        gaveUp = true;
        throw error;
      }
      const result = await running;
      stopHeartbeat(state);
      if (!result.committed) {
        markLost(state, 'fenced');
        return { committed: false, reason: 'lease-lost' };
      }
      if (stored && replays !== undefined && committedResponse !== undefined) {
        replays.set(lease.id, completedRecord(lease, committedResponse), elapsed());
      }
      if (onEvent) {
        // The same events as complete(): `complete` with the status, or `release` and `not-stored`.
        const { id, operation } = lease;
        const at = now();
        const done = elapsed();
        if (stored) {
          emit({
            type: 'complete',
            id,
            operation,
            status,
            at,
            durationMs: done - started,
            executionMs: done - state.begunAt,
          });
        } else {
          emit({ type: 'release', id, operation, at, durationMs: done - started, executionMs: done - state.begunAt });
          emit({ type: 'not-stored', id, operation, status, at });
        }
      }
      return { committed: true, value: result.value as T, stored };
    } catch (error) {
      if (handlerError) throw handlerError.error;
      // The handler left the transaction aborted (a statement of its own failed and it went on), so
      // the store could not complete the record: the handler's failure, rethrown as its own error
      // would be, with the lease still held. Reported as a store-error and answered 503, it would
      // send an operator after an outage that is not there, and the client into retrying for ever.
      if (isTransactionAbortedError(error)) throw error;
      stopHeartbeat(state);
      if (!isIdempotencyError(error)) {
        if (onEvent)
          emit({
            type: 'store-error',
            id: lease.id,
            operation: lease.operation,
            phase: 'transaction',
            error,
            at: now(),
          });
      }
      // The transaction rolled back: nothing of the handler happened, so the key is freed for a retry
      // (a recovered run's left abandoned, as it found it: see letGo).
      await withTimeout('release', () => letGo(state)).catch(() => undefined);
      return { committed: false, reason: 'store-error', error };
    }
  };

  const engine: IdempotencyEngine & { [settleNow]: SettleNow } = {
    // Answers `unprotected` only when asked with `storeUnavailable: 'fail-open'`, as the overloads say.
    begin: begin as IdempotencyEngine['begin'],
    complete,
    release,
    [settleNow]: { complete: completeNow, release: releaseNow, retentionFor },
    transaction,
    transactional: isTransactionalStore(store),
    settings: Object.freeze({
      retentionMs,
      leaseMs,
      waitMs,
      storeTimeoutMs,
      maxExecutionMs,
      unavailableRetryAfter,
      storeMaxResponseBytes: typeof store.maxResponseBytes === 'number' ? store.maxResponseBytes : undefined,
    }),
  };
  return engine;
}
