import { IdempotencyError } from './errors.js';
import type { IdempotencyEvent, LeaseLostReason } from './events.js';
import type { LeaseState } from './lease-state.js';
import type { Store } from './store.js';

/**
 * Watches the leases this process holds: renews them while their handlers run (one heartbeat for
 * the engine, or a timer per lease), stops a lease past `maxExecution`, and marks one lost (its
 * signal aborted, a `lease-lost` event) when the store refused it, renewals failed for a whole
 * lease, or a claim took its key over. `held` is the engine's map of those leases: a claim adds to
 * it and `startHeartbeat`s, `stopHeartbeat` takes a lease out when its execution settles.
 */
export function leaseWatch({
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
}: {
  store: Pick<Store, 'renew'>;
  held: Map<string, LeaseState>;
  leaseMs: number;
  heartbeat: boolean | 'per-lease';
  perLease: boolean;
  maxExecutionMs: number;
  inProcess: boolean;
  conflictRetryAfter: number;
  elapsed: () => number;
  withTimeout: <T>(operation: string, work: () => T | Promise<T>) => Promise<T>;
  onEvent: ((event: IdempotencyEvent) => void) | undefined;
  emit: (event: IdempotencyEvent) => void;
  now: () => number;
}) {
  // One heartbeat for all leases of this engine: a timer per lease would cost more than a claim.
  // Each tick renews the leases last renewed a third of a lease ago or more, so a lease is renewed
  // before about 0.6 of its life has passed, leaving time for a slow or failed renewal to be retried.
  let beat: ReturnType<typeof setInterval> | undefined;
  // A one-shot wake-up for the end of a lease whose renewals have not been confirmed (see `tick`).
  let watch: ReturnType<typeof setTimeout> | undefined;
  const beatEvery = Math.max(25, Math.floor(leaseMs / 4));

  const stopHeartbeat = (lease: LeaseState) => {
    lease.finished = true;
    if (held.get(lease.id) === lease) held.delete(lease.id);
    if (lease.beat !== undefined) {
      clearInterval(lease.beat);
      clearTimeout(lease.watch);
      lease.beat = undefined;
      lease.watch = undefined;
    }
  };

  // A lease read (its signal) after its end passed unrenewed is lost now, whether or not the tick that
  // would find it has run (see `watchReads`). Only for a store behind a network with the heartbeat
  // on: nobody outside the process shares an in-process store, and without the heartbeat no lease
  // is watched at all.
  const checkLease =
    heartbeat && !inProcess
      ? (lease: LeaseState) => {
          if (!lease.lost && !lease.finished && elapsed() - lease.lastRenewedAt >= leaseMs)
            markLost(lease, 'renew-failed');
        }
      : undefined;

  const markLost = (lease: LeaseState, reason: LeaseLostReason) => {
    // A lease that went a whole lease without a renewal the store confirmed may have ended there, so
    // its handler is told at once. But the store may only be slow (a renewal still on its way lands
    // and extends it), or back before anyone took the key over: the heartbeat keeps trying, so a
    // handler that carries on is not left without a lease for another worker to take. Every other
    // reason is final.
    if (reason !== 'renew-failed') stopHeartbeat(lease);
    if (lease.lost) return;
    lease.lost = true;
    // The reason a handler that stops on the signal throws (`throwIfAborted()`, a fetch given it):
    // an IdempotencyError the adapters answer as a problem, 503 with Retry-After, as they do their
    // own refusals. Its retry gets the outcome of whoever holds the key now (409, then the replay).
    lease.lostError = new IdempotencyError(
      'lease_lost',
      `Lease lost (${reason}): this execution no longer holds the key; retry with the same key.`,
      { retryAfter: conflictRetryAfter },
    );
    lease.controller?.abort(lease.lostError);
    if (onEvent) emit({ type: 'lease-lost', id: lease.id, operation: lease.operation, reason, at: now() });
  };

  const renew = (lease: LeaseState) => {
    lease.renewing = true;
    const started = elapsed();
    withTimeout('renew', () => store.renew({ id: lease.id, token: lease.token, leaseMs }))
      .then((renewed) => {
        // A renewal that lands after complete or release took over fails by design: not a lost lease.
        if (lease.finished) return;
        if (renewed) lease.lastRenewedAt = started;
        else if (lease.retrying) {
          // The completion that failed may have landed after all (its answer lost, its deadline
          // passed as it was written): the record is then completed under this very token, and a
          // renewal is refused. Not a lost lease: renewals stop, and the retry's own refused
          // completion reads the record to tell which (settleRefusedRetry). stopHeartbeat marks the
          // lease finished; it is not yet, and the retry's timer skips a finished one: set back.
          stopHeartbeat(lease);
          lease.finished = false;
        } else markLost(lease, 'renew-refused');
      })
      .catch((error) => {
        if (lease.finished) return;
        if (onEvent)
          emit({ type: 'store-error', id: lease.id, operation: lease.operation, phase: 'renew', error, at: now() });
        // Without a successful renewal for a whole lease, the store may have let another executor in.
        if (elapsed() - lease.lastRenewedAt >= leaseMs) markLost(lease, 'renew-failed');
      })
      .finally(() => {
        lease.renewing = false;
      });
  };

  // Renews one lease if due; returns when its end would pass unrenewed, for a wake-up then (infinite
  // when nothing needs one).
  const tend = (lease: LeaseState, t: number): number => {
    // A handler past maxExecution is given up on: no more renewals, so the store ends its lease.
    if (maxExecutionMs > 0 && t - lease.begunAt >= maxExecutionMs) {
      markLost(lease, 'max-execution');
      return Number.POSITIVE_INFINITY;
    }
    // One lease after the last confirmed renewal was sent, the store's lease may have ended (it
    // was set no earlier than that), even while a renewal hangs there: tell the handler before
    // another worker's retry can take the key over. Counted from the send, not the answer: a
    // renewal's own deadline (storeTimeout) may be longer than the lease.
    // (Not for an in-process store: nobody outside this process shares it, and its renewal, sent
    // below, is answered before any other request of this process can claim, even after a stall.)
    const end = lease.lastRenewedAt + leaseMs;
    let wake = Number.POSITIVE_INFINITY;
    if (!inProcess) {
      if (t >= end) markLost(lease, 'renew-failed');
      else wake = end;
    }
    if (!lease.renewing && t - lease.lastRenewedAt >= leaseMs / 3) renew(lease);
    return wake;
  };

  const tick = () => {
    if (held.size === 0) {
      clearInterval(beat);
      beat = undefined;
      clearTimeout(watch);
      return;
    }
    const t = elapsed();
    let soonest = Number.POSITIVE_INFINITY;
    // (tend may delete from `held` while this iterates it: safe for a Map.)
    for (const lease of held.values()) soonest = Math.min(soonest, tend(lease, t));
    // A lease can reach that end between two ticks (its renewals hang): wake up then, not a tick late.
    if (soonest - t < beatEvery) {
      clearTimeout(watch);
      watch = setTimeout(tick, Math.max(1, Math.ceil(soonest - t)));
      watch.unref?.();
    }
  };

  // The same for one lease, on its own timers (`heartbeat: 'per-lease'`), which stopHeartbeat clears.
  const tickOne = (lease: LeaseState) => {
    const t = elapsed();
    const wake = tend(lease, t);
    if (lease.beat !== undefined && wake - t < beatEvery) {
      clearTimeout(lease.watch);
      lease.watch = setTimeout(tickOne, Math.max(1, Math.ceil(wake - t)), lease);
      lease.watch.unref?.();
    }
  };

  const startHeartbeat = (lease: LeaseState) => {
    if (!heartbeat) return;
    if (perLease) {
      // Set here, while the claiming request runs: on Workers, the one whose timers live as long as
      // this lease's handler. (A completion retried in the background starts it again: stopHeartbeat
      // cleared it before the store was asked.)
      if (lease.beat !== undefined) return;
      lease.beat = setInterval(tickOne, beatEvery, lease);
      lease.beat.unref?.();
      return;
    }
    if (beat !== undefined) return;
    beat = setInterval(tick, beatEvery);
    beat.unref?.();
  };
  return { startHeartbeat, stopHeartbeat, markLost, checkLease };
}
