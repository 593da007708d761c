/** Fields every event carries. `id` is the hashed record id, never the raw key. */
interface EventBase {
  id: string;
  operation: string;
  /** When the event happened (engine clock, epoch ms). */
  at: number;
}

/**
 * What the engine reports through `onEvent`, for metrics, traces and logs:
 * - `claim`: a key was claimed; the handler runs.
 * - `replay`: a stored outcome was served (`cached: true` when `replayCache` answered, without
 *   asking the store).
 * - `conflict`: the key was in progress; the request got 409.
 * - `mismatch`: the key was used with another request; 422 (or 400).
 * - `complete`: an outcome was stored.
 * - `not-stored`: the policy chose not to store an outcome, or the handler said it had no effect
 *   (`release()` on its idempotency context); the key was released.
 * - `release`: a claim was released.
 * - `lease-lost`: the lease could not be renewed or its token was no longer current; the late
 *   finisher's outcome was refused.
 * - `store-error`: a store operation failed or timed out. With `unprotected: true` (phase `claim`,
 *   under `storeUnavailable: 'fail-open'`), the request then ran its handler unprotected.
 * - `policy-error`: the `storeOutcome` function threw or returned no decision; the outcome was stored
 *   with the default retention, as the spec's rule has it.
 * - `refused`: a covered request was answered with a 4xx/5xx problem before any record was touched:
 *   its key was missing (`key_missing`) or malformed (`key_invalid`), there was no caller to scope it
 *   to (`scope_missing`), or its body was over `maxBodyBytes` (`body_too_large`) or cut short
 *   (`body_incomplete`). It has no `id`: no record was looked up. Nothing ran.
 * - `response-not-stored`: an adapter served a response it could not store (too large, streaming, an
 *   event stream), or the 404 of a request that no route took (`no-route`) or the answer of a body
 *   parser that refused the body (`body-refused`), which are no outcomes; or a response that was
 *   closed before its head went out and can never be ended (`closed`: the server destroyed it without
 *   an error and without a body stream piped into it). A body stream that failed before its first
 *   chunk is `streaming`, as one that fails after its head. For `too-large` and `streaming` the
 *   operation ran, and the outcome policy decides as for the status sent: `complete` follows
 *   (status 500: the key is kept, and its retries get `response_not_replayable`), or `release` and
 *   `not-stored`. In transactional mode they always release it: the handler's writes rolled back,
 *   so nothing ran. `answered-early`: something else
 *   answered while the handler still ran (a timeout middleware's 503): the operation ran or is
 *   running, so the key is kept with `response_not_replayable` whatever the policy says (`complete`
 *   follows, status 500), once the handler ended where the adapter can tell; only a handler that
 *   then threw, under a policy that releases thrown handlers, releases it. `transaction-aborted`
 *   (transactional mode): the handler left its transaction aborted (a statement of its own failed
 *   and it went on without a SAVEPOINT), so nothing committed; its answer (`status`) is replaced by
 *   `500 transaction_aborted`. Every other reason releases the key.
 */
export type IdempotencyEvent =
  | (EventBase & {
      type: 'claim';
      durationMs: number;
      /** The claim took the key over from an attempt whose lease ran out unrenewed (a crash). */
      recovered?: true;
    })
  | (EventBase & { type: 'replay'; status: number; durationMs: number; cached?: true })
  | (EventBase & { type: 'conflict'; durationMs: number })
  | (EventBase & { type: 'mismatch'; durationMs: number })
  | (EventBase & { type: 'complete'; status: number; durationMs: number; executionMs: number })
  | (EventBase & { type: 'not-stored'; status: number })
  | (EventBase & { type: 'release'; durationMs: number; executionMs?: number })
  | (EventBase & { type: 'lease-lost'; reason: LeaseLostReason })
  | (EventBase & {
      type: 'store-error';
      phase: 'claim' | 'get' | 'renew' | 'complete' | 'release' | 'transaction';
      error: unknown;
      /**
       * The claim could not reach the store and `storeUnavailable: 'fail-open'` let the request run
       * without its key: nothing records it, and a retry runs it again. Count these.
       */
      unprotected?: true;
    })
  | (EventBase & { type: 'policy-error'; error: unknown })
  | {
      type: 'refused';
      /** No record was looked up, so there is none to name (declared so `event.id` reads on any event). */
      id?: undefined;
      code: RefusalCode;
      status: number;
      operation: string;
      at: number;
    }
  | (EventBase & {
      type: 'response-not-stored';
      reason: NotStoredReason;
      status: number;
    });

/**
 * Why a lease was lost (`lease-lost` events):
 * - `max-execution`: the handler ran past `maxExecution`, so its lease is no longer renewed;
 * - `renew-refused`: a renewal was answered, but the token was no longer current (another execution
 *   took the key over);
 * - `renew-failed`: no renewal was confirmed for a whole lease, counted from the last confirmed one's
 *   sending (errors, timeouts, a renewal still unanswered, a stalled process): the store may have let
 *   another execution in. The heartbeat keeps trying, so the key stays held if the store still
 *   renews it;
 * - `taken-over`: another request of this process took the abandoned key over;
 * - `fenced`: complete, release or a transaction's commit found the token no longer current, so the
 *   late finisher's outcome was refused.
 */
export type LeaseLostReason = 'max-execution' | 'renew-refused' | 'renew-failed' | 'taken-over' | 'fenced';

/** Why a served response was not stored: see `response-not-stored` above. */
export type NotStoredReason =
  | 'too-large'
  | 'streaming'
  | 'event-stream'
  | 'no-route'
  | 'body-refused'
  | 'closed'
  | 'answered-early'
  | 'transaction-aborted';

/** Why a covered request was refused before its record was looked up: see `refused` above. */
export type RefusalCode = 'key_missing' | 'key_invalid' | 'scope_missing' | 'body_too_large' | 'body_incomplete';

/** The names of all events. */
export type IdempotencyEventType = IdempotencyEvent['type'];
