import { toMilliseconds } from './duration.js';
import { type IdempotencyOptions, MAX_RETENTION_MS } from './engine-options.js';
import type { Lease } from './engine-types.js';
import type { IdempotencyEvent } from './events.js';
import { type Outcome, type OutcomeDecision, presetPolicy } from './outcome-policy.js';
import type { StoredResponse } from './store.js';

/**
 * The engine's outcome policy, applied: whether a finished execution's outcome is stored, and for
 * how long (`decide`); how long one would be kept, for the HTTP layer to announce before it is known
 * (`retentionFor`); and the decision for a key kept whatever the policy says (`keptAtLeastAsSuccess`).
 * `policy` is the resolved `storeOutcome`; a named preset is also asked directly (see below).
 */
export function outcomeDecisions({
  options,
  policy,
  retentionMs,
  onEvent,
  emit,
  now,
}: {
  options: Pick<IdempotencyOptions, 'storeOutcome'>;
  policy: (outcome: Outcome) => OutcomeDecision;
  retentionMs: number;
  onEvent: ((event: IdempotencyEvent) => void) | undefined;
  emit: (event: IdempotencyEvent) => void;
  now: () => number;
}) {
  const preset =
    options.storeOutcome === undefined || typeof options.storeOutcome === 'string'
      ? presetPolicy(options.storeOutcome ?? 'all')
      : undefined;
  const storeIt = Object.freeze({ store: true as const, retentionMs });
  const dropIt = Object.freeze({ store: false as const, retentionMs });
  // A policy function's decision for one outcome; throws when the function throws or decides nothing.
  // (A preset never throws and is asked directly: the default policy costs no object per outcome.)
  const decisionOf = (outcome: Outcome) => {
    const decided = policy(outcome);
    if (decided === false) return dropIt;
    if (decided === true) return storeIt;
    if ((decided as { store?: unknown }).store !== true) throw new TypeError('storeOutcome returned no decision');
    const retention = toMilliseconds(decided.retention, 'retention');
    if (!(retention > 0) || retention > MAX_RETENTION_MS)
      throw new TypeError('a stored outcome needs a retention above 0 and at most 3650d');
    return { store: true as const, retentionMs: retention };
  };
  const retentionFor = (status: number, operation: string, thrown = false): number | undefined => {
    if (preset) return preset(status, thrown) ? retentionMs : undefined;
    try {
      const decided = decisionOf({ status, thrown, operation });
      return decided.store ? decided.retentionMs : undefined;
    } catch {
      // As `decide` below: a policy that fails stores with the default retention.
      return retentionMs;
    }
  };
  // A key kept whatever the policy says (an execution whose own outcome can never be known) is kept
  // at least as long as the policy would keep a success of its operation: the handler ran on, most
  // likely to success, and a policy that keeps one operation's outcomes longer than the default
  // retention must not see that key run again sooner. Asked only on that rare path.
  const keptAtLeastAsSuccess = (operation: string) => {
    const success = retentionFor(200, operation);
    return success === undefined || success <= retentionMs ? storeIt : { store: true as const, retentionMs: success };
  };
  // The policy judges `outcome.status` when given (the status the client was sent, for a response
  // stored in another form), else the status of the response stored.
  const decide = (response: StoredResponse, outcome: Partial<Outcome> | undefined, lease: Lease) => {
    if (preset) return preset(outcome?.status ?? response.status, outcome?.thrown === true) ? storeIt : dropIt;
    try {
      return decisionOf({ ...outcome, status: outcome?.status ?? response.status, operation: lease.operation });
    } catch (error) {
      // A policy that throws, or decides something that is not a decision, must not leave the key
      // in progress for as long as the heartbeat renews it. The execution happened, so its outcome
      // is stored as the spec's rule has it (a release would run it again on retry), and reported.
      if (onEvent) emit({ type: 'policy-error', id: lease.id, operation: lease.operation, error, at: now() });
      return storeIt;
    }
  };
  return { retentionFor, keptAtLeastAsSuccess, decide };
}
