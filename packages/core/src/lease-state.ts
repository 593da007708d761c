import type { Lease } from './engine-types.js';
import type { IdempotencyError } from './errors.js';

/**
 * The engine's own lease object. A class, so every lease has one hidden shape with its fields in
 * the object itself, and `signal` is a getter on the prototype: an object literal with its own
 * getter costs a closure and a slow literal per claim.
 */
export class LeaseState implements Lease {
  lost = false;
  /** The signal's abort reason once the lease is lost (set with `lost`). */
  lostError: IdempotencyError | undefined = undefined;
  recovered = false;
  /** Made on first use of `signal`: most handlers never look at it. */
  controller: AbortController | undefined = undefined;
  renewing = false;
  /** Set once complete, release or transaction took over: a renewal still in flight then means nothing. */
  finished = false;
  /** Set while a failed completion is tried again in the background (see `retryCompletion`). */
  retrying = false;
  lastRenewedAt: number;
  /**
   * Marks the lease lost when its end has passed unrenewed (see `signal`); set by the engine for
   * stores behind a network, where another worker may take the key over at that end.
   */
  check: ((lease: LeaseState) => void) | undefined = undefined;
  /** Its own renewal timer and end-of-lease wake-up, with `heartbeat: 'per-lease'` only. */
  beat: ReturnType<typeof setInterval> | undefined = undefined;
  watch: ReturnType<typeof setTimeout> | undefined = undefined;

  constructor(
    readonly id: string,
    readonly key: string,
    readonly scope: string,
    readonly operation: string,
    readonly token: string,
    readonly fingerprint: string,
    readonly startedAt: number,
    /** When it began on the engine's interval clock (see `elapsed`), which maxExecution counts from. */
    readonly begunAt: number,
  ) {
    this.lastRenewedAt = begunAt;
  }

  get signal(): AbortSignal {
    this.check?.(this);
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.lost) this.controller.abort(this.lostError);
      if (this.check !== undefined) watchReads(this.controller.signal, this);
    }
    return this.controller.signal;
  }
}

/**
 * Makes a lease's signal current when it is read, not only when the heartbeat ticks. After an event
 * loop stall past the lease, overdue timers run in the order they were due: a handler's callback may
 * run before the tick that finds the lease ended, read `aborted` as false and make its effect while
 * another worker, which took the key over during the stall, makes it too. So reading `aborted` (or
 * calling `throwIfAborted()`) first looks at the clock. Own members of this one signal; `fetch` and
 * listeners see the abort itself as usual.
 */
function watchReads(signal: AbortSignal, lease: LeaseState): void {
  const aborted = Object.getOwnPropertyDescriptor(AbortSignal.prototype, 'aborted')?.get;
  const throwIfAborted = AbortSignal.prototype.throwIfAborted;
  if (aborted === undefined) return;
  Object.defineProperty(signal, 'aborted', {
    configurable: true,
    get() {
      lease.check?.(lease);
      return aborted.call(signal);
    },
  });
  Object.defineProperty(signal, 'throwIfAborted', {
    configurable: true,
    writable: true,
    value() {
      lease.check?.(lease);
      return throwIfAborted.call(signal);
    },
  });
}
