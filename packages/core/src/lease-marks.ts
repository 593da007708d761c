import type { Lease } from './engine-types.js';
import { headWentOut } from './http-capture.js';
import type { ResponseCapture } from './http-types.js';

// What the HTTP layer marks on a lease, as bits of one property under a symbol of this module: its
// response ended (a release() after that changes nothing, held or not), and its handler said it had
// no effect (`IdempotencyContext.release`). Two WeakSets held these before: an entry per request in a
// weak collection is work for every garbage collection while it lives.
const marksKey = Symbol('idem http marks');
export const endedMark = 1;
export const noEffectMark = 2;
const answeringMark = 4;
// The capture of the lease's response, for `IdempotencyContext.answeringForHandler`.
const captureOfLease = Symbol('idem capture of lease');
type MarkedLease = Lease & { [marksKey]?: number; [captureOfLease]?: ResponseCapture };

export function mark(lease: Lease, bit: number): void {
  const marked = lease as MarkedLease;
  marked[marksKey] = (marked[marksKey] ?? 0) | bit;
}

export function hasEnded(lease: Lease): boolean {
  return (((lease as MarkedLease)[marksKey] ?? 0) & endedMark) !== 0;
}

export function hadNoEffect(lease: Lease): boolean {
  return (((lease as MarkedLease)[marksKey] ?? 0) & noEffectMark) !== 0;
}

export function answeredForHandler(lease: Lease): boolean {
  return (((lease as MarkedLease)[marksKey] ?? 0) & answeringMark) !== 0;
}

export function watchedBy(lease: Lease, capture: ResponseCapture): void {
  (lease as MarkedLease)[captureOfLease] = capture;
}

// `IdempotencyContext.answeringForHandler`: the capture takes the answer about to be written as one
// for a running handler (as `idempotencyErrors()` does for connect-timeout's), and the settlement
// knows that an error thrown through the chain with it was the timeout's, not the handler's. After
// the response ended, the handler answered first: nothing to change. So too once the handler's head
// went out (a timer firing while it streams): no other answer can be written in its place (Node
// refuses a second head), and the handler's, whole, is its outcome. Marked, it was settled as a
// timeout's and the key kept `500 response_not_replayable` though its client had the whole answer.
// Held, nothing went out yet: a head written into the hold is still taken (see transactionOf).
// The lease is marked all the same: a Koa timeout below idempotency() still throws through the
// chain, and that error is the timeout's, not the handler's (see settleAtOnce).
export function answeringForHandler(lease: Lease): void {
  if (hasEnded(lease)) return;
  mark(lease, answeringMark);
  const capture = (lease as MarkedLease)[captureOfLease];
  if (capture !== undefined && !headWentOut(capture)) capture.answeredForHandler();
}
