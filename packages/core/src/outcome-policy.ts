import type { Duration } from './duration.js';

/** What the policy sees of a finished execution. `thrown` is set when the handler threw. */
export interface Outcome {
  status: number;
  thrown?: boolean;
  /**
   * What was executed, as the record has it: the `operation` given to `begin`. In the adapters, the
   * method and route template (`POST /charges/:id/refunds`), or, for Express and Koa mounted
   * app-wide (they claim before routing), the method and path as the router matches it. Set by the
   * engine for every decision, so one app-wide policy can treat routes apart (a longer retention
   * for payouts, say).
   */
  operation?: string;
  /**
   * Set when the response was served but cannot be replayed: it was larger than the adapter stores
   * (`'too-large'`), or its body was cut short after its head went out, by a client that left or a
   * stream that failed (`'streaming'`). `status` is the status the client was sent. The operation
   * ran, so storing keeps the key: its retries get `500 response_not_replayable` (replayed) and never
   * run it again. Releasing lets a retry run it again. The presets decide as for any response of that
   * status.
   */
  unreplayable?: 'too-large' | 'streaming';
}

/**
 * The decision for one outcome: store it (optionally with its own retention), or release the key
 * so that a retry runs again.
 */
export type OutcomeDecision = boolean | { store: true; retention: Duration };

/** A named preset or a function deciding per outcome. */
export type OutcomePolicy = 'all' | 'success' | 'stripe' | ((outcome: Outcome) => OutcomeDecision);

/**
 * Presets:
 * - `all` (default, the spec's rule): every response of an execution that began is stored,
 *   except 401, 403 and 429, which say the request was refused before doing anything, so a retry
 *   with a fixed token or after a pause must be able to run.
 * - `success`: only 2xx is stored (Checkout.com, express-idempotency); anything else releases.
 * - `stripe`: close to Stripe's documented behaviour: everything once execution began, including
 *   500s, but not 401 or 429. One departure: a thrown handler is released (read as a crash before
 *   any effect, so its retry runs), where Stripe keeps its 500 too; `all` keeps it.
 */
export function resolveOutcomePolicy(policy: OutcomePolicy): (outcome: Outcome) => OutcomeDecision {
  if (typeof policy === 'function') return policy;
  const preset = presetPolicy(policy);
  return ({ status, thrown }) => preset(status, thrown === true);
}

/**
 * A preset as a plain function of status and `thrown`, so the engine can decide without building an
 * outcome object per request.
 */
export function presetPolicy(name: 'all' | 'success' | 'stripe'): (status: number, thrown: boolean) => boolean {
  switch (name) {
    case 'all':
      return (status) => status !== 401 && status !== 403 && status !== 429;
    case 'success':
      return (status, thrown) => !thrown && status >= 200 && status < 300;
    case 'stripe':
      return (status, thrown) => !thrown && status !== 401 && status !== 429;
    default:
      throw new TypeError(`storeOutcome must be 'all', 'success', 'stripe' or a function`);
  }
}
