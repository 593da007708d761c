import type { IdempotencyEvent } from '@idem/core';

/**
 * The line an operator should read for an idempotency event of `component` (`API`, `receiver`: the
 * part of the app whose keyed route it is, the line's prefix), or `undefined` for an ordinary one.
 * These are the events docs/operations.md says to log and alert on ("Metrics, traces and logs",
 * "Investigating one key"): a store error, a policy error, a lost lease, a claim that took over a
 * crashed attempt (`recovered`: the operation may have run twice), a response served but not stored,
 * and a 5xx the policy released (its retry runs the operation again). A claim, a replay, a
 * completion, a 409, a 422 and a refused request are routine, and a client could fill the log with
 * them: they write nothing.
 *
 * A line names the record by its hashed id (`event.id`), which support computes from a ticket with
 * `recordId(principalScope(auth, { perClient: true }), operation, key)`, and never the key, the
 * caller, a token or a body: an error is told by its name, its `code` and its cause's `code`, and its
 * message only when it is one of idem's own (which name the store operation and nothing else). A
 * driver's message may quote what it was sent.
 *
 * @example
 * ```ts
 * idempotencyLogLine({ type: 'claim', id: 'q3J…', operation: 'POST /charges', at: 0, durationMs: 2, recovered: true }, 'API');
 * // 'API: idempotency claim recovered for record q3J… (POST /charges): took over a crashed attempt, which may have run the operation too'
 * ```
 */
export function idempotencyLogLine(event: IdempotencyEvent, component: string): string | undefined {
  const about = (what: string) =>
    `${oneLine(component)}: idempotency ${what} for record ${oneLine(event.id ?? '-')} (${oneLine(event.operation)})`;
  switch (event.type) {
    case 'claim':
      return event.recovered
        ? `${about('claim recovered')}: took over a crashed attempt, which may have run the operation too`
        : undefined;
    case 'store-error':
      return `${about('store-error')}, phase ${event.phase}: ${describeError(event.error)}`;
    case 'policy-error':
      return `${about('policy-error')}: storeOutcome failed (${describeError(event.error)}); the outcome was stored`;
    case 'lease-lost':
      return `${about('lease-lost')}, reason ${event.reason}: the lease was lost`;
    case 'response-not-stored':
      return `${about('response-not-stored')}, reason ${event.reason}, status ${event.status}: the response was served but not stored`;
    case 'not-stored':
      // Released 4xx (401, 429) are routine; a released 5xx is an operation a retry runs again.
      return event.status >= 500
        ? `${about('not-stored')}, status ${event.status}: a server error was not stored; a retry runs the operation again`
        : undefined;
    default:
      return undefined;
  }
}

/**
 * The default `onIdempotencyEvent` of the API (`idempotencyLogger('API')`) and of the receiver
 * (`idempotencyLogger('receiver')`): {@link idempotencyLogLine} on stderr, one line per event worth an
 * operator's attention, nothing for the others. The prefix tells which part's store and route a line
 * is about, for the one output `npm start` writes both to.
 *
 * @example
 * ```ts
 * idempotency({ store, onEvent: idempotencyLogger('receiver') });
 * ```
 */
export function idempotencyLogger(component: string): (event: IdempotencyEvent) => void {
  return (event) => {
    const line = idempotencyLogLine(event, component);
    if (line !== undefined) process.stderr.write(`${line}\n`);
  };
}

/** An error's name, `code` and cause's `code`; its message only when it is idem's own. */
function describeError(error: unknown): string {
  if (!(error instanceof Error)) return typeof error;
  const { code, cause } = error as { code?: unknown; cause?: unknown };
  const causeCode = (cause as { code?: unknown } | null | undefined)?.code;
  const parts = [oneLine(error.name)];
  if (isCode(code)) parts.push(code);
  if (idemErrors.has(error.name)) parts.push(JSON.stringify(oneLine(error.message)));
  if (isCode(causeCode)) parts.push(`(cause ${causeCode})`);
  return parts.join(' ');
}

// Their messages are written by idem and name the store operation only (`Redis claim failed`), or
// also what a store that answered said: a contended claim, Redis's reply code and text with the
// arguments it echoes cut off (`Redis claim was refused: NOPERM ...`).
const idemErrors = new Set(['StoreUnavailableError', 'IdempotencyError', 'StoreContendedError', 'RedisCommandError']);

// A code is a short identifier (`store_unavailable`, `ECONNREFUSED`, a SQLSTATE `57P01`), never a value.
const isCode = (value: unknown): value is string => typeof value === 'string' && /^[\w.-]{1,40}$/.test(value);

// One line whatever a value holds: control characters and line separators become spaces, and it is
// cut at 200 characters.
function oneLine(text: string): string {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: the control characters are what it removes.
  return text.replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g, ' ').slice(0, 200);
}
