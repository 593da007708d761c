import type { CompleteResult, Lease, ReleaseResult } from './engine-types.js';
import type { Outcome } from './outcome-policy.js';
import type { Awaitable, StoredResponse } from './store.js';

// Keys into the engine that are not part of its public API: the HTTP layer's settle-now calls,
// and the conformance tables' completion retry pauses.

/**
 * Key of the engine's `complete` and `release` that answer with a value when the store did, for the
 * HTTP layer of this package only (not exported from the package).
 */
export const settleNow = Symbol('idem settle now');

/** What {@link settleNow} holds. */
export interface SettleNow {
  /**
   * With `keep`, the response is stored whatever the outcome policy says, with the default
   * retention or, when longer, the one the policy gives a success (200) of the operation: the HTTP
   * layer's answer for an execution whose own outcome can never be known (a timeout answered while
   * the handler ran), which must not run again.
   */
  complete(
    lease: Lease,
    response: StoredResponse,
    outcome?: Partial<Outcome>,
    keep?: boolean,
  ): Awaitable<CompleteResult>;
  release(lease: Lease): Awaitable<ReleaseResult>;
  /**
   * How long an outcome of `status` (of a handler that threw, with `thrown`) would be kept, per the
   * outcome policy, or undefined when the policy releases it: what the HTTP layer's
   * `advertiseExpiry` announces when the head goes out. Reports nothing: the completion decides
   * again, and reports a policy that throws.
   */
  retentionFor(status: number, operation: string, thrown?: boolean): number | undefined;
}

/**
 * Key of an internal option: a function of the attempt (0 to 4) giving the pause in ms before that
 * background retry of a failed completion, in place of the production 100 ms doubling to 1.6 s.
 * For conformance tables only (testkit's `describeAdapter` runs its "store keeps failing" scenario
 * in every framework x store x mode, and would wait 3.1 s of real time in each). A registry symbol,
 * so testkit can set it without this package exporting it: no public option, not documented, and
 * the option-name check (string names only) lets it through. The number of retries is not part of it.
 */
export const completionRetryPauses: unique symbol = Symbol.for('@idem/core.completionRetryPauses');

// The production pause before retry `attempt` (0 to 4) of a failed completion: 100 ms, doubling to 1.6 s.
export const completionRetryPause = (attempt: number) => 100 * 2 ** attempt;
