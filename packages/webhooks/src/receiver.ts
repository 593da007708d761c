import { createHash } from 'node:crypto';
import {
  assertKnownOptions,
  createIdempotency,
  type Duration,
  downstreamKey,
  type IdempotencyEngine,
  IdempotencyError,
  type IdempotencyErrorCode,
  type IdempotencyEvent,
  isIdempotencyError,
  isStoreUnavailableError,
  type Lease,
  type ListsEvery,
  notify,
  type Store,
  type StoredResponse,
  toMilliseconds,
} from '@idem/core';
import { toBodyBytes } from './body.js';
import { WebhookError, type WebhookErrorCode } from './errors.js';
import type { HeaderInput } from './headers.js';
import type { WebhookSecret } from './secrets.js';
import { createVerifier, type Tolerance } from './signature.js';

/** A verified event, as `apply` receives it. */
export interface ReceivedEvent {
  /** The `webhook-id`: the same on every retry of this event. */
  id: string;
  /** The signed timestamp of this attempt, Unix seconds. */
  timestamp: number;
  /** The exact verified bytes. */
  body: Buffer;
  /** The scope (sender or endpoint) this receiver records ids under. */
  scope: string;
  /** The body parsed as JSON, a leading byte order mark ignored (throws a `SyntaxError` on a body that is not JSON). */
  json<T = unknown>(): T;
  /**
   * Aborts when this delivery's claim is lost: its renewal was refused or none confirmed for a whole lease,
   * or `apply` ran past `maxExecution`. Another delivery of the event may then apply it, so an
   * `apply` that has not made its effect yet should stop; pass it to `fetch`, a query or a timer.
   */
  readonly signal: AbortSignal;
  /**
   * The idempotency key for a call `apply` makes to another service (`purpose` names the call): the
   * same on every delivery of this event, so that service makes its effect once even when a
   * delivery applies it again after a crash. A UUID; see `downstreamKey` in `@idem/core`.
   */
  keyFor(purpose: string): string;
  /**
   * True when this delivery took the event over from an earlier one whose claim ran out unrenewed
   * (its process crashed or hung while applying it): that delivery may have applied part of it, so
   * an `apply` with effects outside `tx` can look for them first.
   */
  readonly recovered: boolean;
}

/** A framework-neutral response: write `status`, `headers` and `body` as they are. */
export interface ReceiverResponse {
  status: number;
  headers: Record<string, string>;
  body: Uint8Array;
  /**
   * - `applied`: first delivery, `apply` ran and its effect is recorded (if the store fails at that
   *   last step, still acknowledged, with a `record-failed` event: see the receiver docs).
   * - `duplicate`: seen before; acknowledged without applying again.
   * - `rejected`: verification failed (bad signature, headers or timestamp); nothing was recorded.
   * - `in-progress`: the same event is being applied right now; 409, the sender retries.
   * - `mismatch`: the id was already used for another body; 422, never acknowledged.
   * - `failed`: `apply` threw; nothing is recorded, the retry applies.
   * - `unavailable`: the store could not be reached, before, inside (`apply` failed with a
   *   `StoreUnavailableError`, as its `tx` raises for a lost connection) or after `apply`; nothing is
   *   recorded; 503 with `Retry-After`, the sender retries.
   */
  outcome: 'applied' | 'duplicate' | 'rejected' | 'in-progress' | 'mismatch' | 'failed' | 'unavailable';
  /** The event id, once the headers were verified. */
  id?: string;
}

/** What a receiver reports through `onEvent`. */
export type ReceiverEvent =
  | {
      type: ReceiverResponse['outcome'];
      id?: string;
      /** The problem's code, on a refused delivery: a webhook one (`signature_mismatch`, ...) or idem's. */
      code?: WebhookErrorCode | IdempotencyErrorCode;
      at: number;
      /**
       * What went wrong, when there is something to say: what `apply` threw (`failed`), the store's
       * error (`unavailable`), or the {@link WebhookError} of a `rejected` delivery, whose `details`
       * hold facts such as the length of the body received (never its bytes, a key or a signature).
       */
      error?: unknown;
    }
  | { type: 'record-failed'; id: string; reason: 'lease-lost' | 'store-error'; at: number; error?: unknown };

/**
 * A warning a receiver raises about its own configuration:
 * - `retention_below_sender_horizon`: a late retry of an event would be applied again.
 * - `scope_shared`: another receiver in this process already uses the same store object with the
 *   same scope. If it serves another endpoint, an event id sent to both (Stripe and Svix send one id
 *   to every endpoint subscribed) is applied by the first and acknowledged unapplied by the second.
 */
export interface ReceiverWarning {
  code: 'retention_below_sender_horizon' | 'scope_shared';
  message: string;
}

/** Options of {@link createReceiver}. */
export interface ReceiverOptions<Tx = unknown> {
  /** Where event ids are recorded: memory, Redis or PostgreSQL (transactional). */
  store: Store;
  /** The sender's secret(s); several during rotation. */
  secret: WebhookSecret | readonly WebhookSecret[];
  /**
   * Applies the event's effect. In transactional mode `tx` is the store's transaction: write through
   * it and the effect commits together with the record of the event id, or not at all.
   */
  apply: (event: ReceivedEvent, tx: Tx | undefined) => unknown;
  /**
   * How long event ids are remembered, counted from when the first delivery was recorded. Default
   * `'7d'`: longer, with margin, than the common senders' retry horizons (this package's sender 24 h,
   * Svix about 28 h, Stripe 3 days, the Standard Webhooks example schedule 75.6 h); an id's record
   * is a few hundred bytes.
   * Below 24 h needs `acknowledgeShortRetention`.
   */
  retention?: Duration | undefined;
  acknowledgeShortRetention?: boolean | undefined;
  /**
   * How long the sender keeps retrying (and redelivering by hand). A retention shorter than this
   * raises a warning: a late retry would be applied a second time. Default `'76h'`: the longest
   * automatic schedule of the common senders (Standard Webhooks' example, 75.6 h), rounded up.
   */
  senderHorizon?: Duration | undefined;
  /** Receives configuration warnings. Default `process.emitWarning`. */
  onWarning?: ((warning: ReceiverWarning) => void) | undefined;
  /** Signature timestamp tolerance. Default `'5m'` both ways. */
  tolerance?: Tolerance | undefined;
  /**
   * The sender or endpoint; ids are unique per scope. Default `'webhooks'`. Give each endpoint that
   * shares a store its own: senders deliver one event, with one id, to every endpoint subscribed to
   * it, and two endpoints on one scope would apply it only once between them.
   */
  scope?: string | undefined;
  /**
   * A duplicate arriving while the first delivery is being applied: wait up to this long for its
   * outcome (then acknowledge it), or answer 409 at once (`false`, the default) so the sender retries.
   */
  wait?: Duration | false | undefined;
  /** The claim lease while `apply` runs; renewed in the background. Default `'10s'`. */
  lease?: Duration | undefined;
  /**
   * The longest `apply` may hold an event id. Past it the claim is no longer renewed: the event's
   * `signal` aborts, and the sender's next retry applies the event once the lease ends (an `apply`
   * that finishes later is not recorded). Off by default; without it, an `apply` that never settles
   * keeps the id in progress, and every retry gets 409, for as long as the process lives.
   */
  maxExecution?: Duration | false | undefined;
  /** Use the store's transactions when it has them. Default true. */
  transactional?: boolean | undefined;
  /** Clock for the signature tolerance and timings, epoch ms. Default `Date.now`. */
  now?: (() => number) | undefined;
  /** Called once per delivery with its outcome. What it throws or rejects with is swallowed. */
  onEvent?: ((event: ReceiverEvent) => void) | undefined;
  /** Passed to the idempotency engine, for metrics of the store itself. */
  onStoreEvent?: ((event: IdempotencyEvent) => void) | undefined;
}

const receiverOptionNames = [
  'store',
  'secret',
  'apply',
  'retention',
  'acknowledgeShortRetention',
  'senderHorizon',
  'onWarning',
  'tolerance',
  'scope',
  'wait',
  'lease',
  'maxExecution',
  'transactional',
  'now',
  'onEvent',
  'onStoreEvent',
] as const satisfies readonly (keyof ReceiverOptions<unknown>)[];
const receiverOptionNamesAll: ListsEvery<ReceiverOptions<unknown>, typeof receiverOptionNames> = true;
void receiverOptionNamesAll;

/** What {@link Receiver.handle} takes: the request's headers and its raw body. */
export interface ReceiverRequest {
  headers: HeaderInput;
  /** The raw bytes. A parsed object throws `raw_body_required`. */
  body: unknown;
}

/** An idempotent webhook receiver. */
export interface Receiver {
  /** Verifies, deduplicates and applies one delivery, and says what to answer. */
  handle(request: ReceiverRequest): Promise<ReceiverResponse>;
  /** The idempotency engine underneath. */
  readonly engine: IdempotencyEngine;
  /** The resolved settings, in milliseconds. */
  readonly settings: Readonly<{ retentionMs: number; senderHorizonMs: number; transactional: boolean; scope: string }>;
}

const OPERATION = 'webhook';

// The glue (Express, Fastify, Koa, fetch) refuses some deliveries before `handle` can: a body over
// its limit, one that does not decompress, one a parser already consumed. The docs promise one
// `onEvent` per delivery, so the glue reports those here. Not on `Receiver` itself: the glue is the
// only caller, and a public method would let an app fake rejections into its own metrics.
const glueReporters = new WeakMap<Receiver, (error: WebhookError) => void>();

/** Reports a delivery the glue refused for `receiver` through its `onEvent`, as `rejected`. */
export function reportGlueRejection(receiver: Receiver, error: WebhookError): void {
  glueReporters.get(receiver)?.(error);
}

// How many receivers of this process use each scope of each store object. Two on one scope are
// either two instances of one endpoint (harmless, though one process rarely needs two) or two
// endpoints swallowing each other's events; the second kind cannot be told apart, so it warns once.
// Keyed weakly: a store dropped by the app takes its entry with it.
const scopesInUse = new WeakMap<Store, Map<string, number>>();
const ACK_BODY = Buffer.from('{"received":true}');
const utf8 = new TextDecoder();

const ACK: StoredResponse = { status: 200, headers: { 'content-type': 'application/json' }, body: ACK_BODY };

// The core's title and detail for these two speak of a request's Idempotency-Key and of retrying with
// the same key: a webhook sender never sent one, and its log should say what happened to the webhook.
// The type, status, code and Retry-After stay the core's, so a client switching on them is unchanged.
const receiverWords: Partial<Record<string, { title: string; detail: string }>> = {
  in_progress: {
    title: 'Webhook being applied',
    detail: 'This webhook is being applied by another delivery; retry later.',
  },
  store_unavailable: {
    title: 'Webhook store unavailable',
    detail: 'The webhook could not be recorded; retry later.',
  },
};

function problemResponse(
  error: WebhookError | IdempotencyError,
  outcome: ReceiverResponse['outcome'],
  id?: string,
): ReceiverResponse {
  const headers: Record<string, string> = { 'content-type': 'application/problem+json' };
  const retryAfter = (error as { retryAfter?: number }).retryAfter;
  if (retryAfter !== undefined) headers['retry-after'] = String(retryAfter);
  const problem = error.toProblem();
  const words = isIdempotencyError(error) ? receiverWords[error.code] : undefined;
  return {
    status: error.status,
    headers,
    body: Buffer.from(JSON.stringify(words === undefined ? problem : { ...problem, ...words })),
    outcome,
    ...(id === undefined ? {} : { id }),
  };
}

/**
 * Creates an idempotent webhook receiver on the core engine: the `webhook-id` is the idempotency key,
 * the sender (scope) is the caller, the SHA-256 of the body is the fingerprint.
 *
 * - A bad signature, header or timestamp is refused before the store is touched, so an unsigned
 *   request carrying a real id can never mark it as seen.
 * - The first delivery runs `apply` and is acknowledged 200; a repeat is acknowledged without applying.
 * - A concurrent duplicate gets 409 (or waits, with `wait`); the same id with another body gets 422 and
 *   an `onEvent` report, never a silent 2xx.
 * - If `apply` throws, nothing is recorded and the answer is 500, so the sender's retry applies it;
 *   503 with `Retry-After` when what it threw is the database's unavailability (a `StoreUnavailableError`).
 * - With a transactional store (PostgreSQL) the effect and the record commit in one transaction.
 *
 * @example
 * const receiver = createReceiver({
 *   store: memoryStore(),
 *   secret: process.env.WEBHOOK_SECRET!,
 *   apply: async (event) => { await credit(event.json<{ amount: number }>().amount); },
 * });
 * const { status, headers, body } = await receiver.handle({ headers: req.headers, body: rawBody });
 */
export function createReceiver<Tx = unknown>(options: ReceiverOptions<Tx>): Receiver {
  if (!options || typeof options !== 'object') throw new TypeError('createReceiver needs an options object');
  assertKnownOptions(options, new Set(receiverOptionNames), 'createReceiver');
  if (typeof options.apply !== 'function') throw new TypeError('apply must be a function');
  const now = options.now ?? Date.now;
  const verifier = createVerifier({
    secret: options.secret,
    now,
    ...(options.tolerance === undefined ? {} : { tolerance: options.tolerance }),
  });
  const retention = options.retention ?? '7d';
  const engine = createIdempotency({
    store: options.store,
    retention,
    acknowledgeShortRetention: options.acknowledgeShortRetention ?? false,
    wait: options.wait ?? false,
    // Passed on only when injected: the engine's default times leases and waits on a monotonic clock.
    ...(options.now === undefined ? {} : { now: options.now }),
    // An acknowledgement is only stored for a 2xx; every other outcome leaves the id free for a retry.
    storeOutcome: 'success',
    ...(options.lease === undefined ? {} : { lease: options.lease }),
    ...(options.maxExecution === undefined ? {} : { maxExecution: options.maxExecution }),
    ...(options.onStoreEvent === undefined ? {} : { onEvent: options.onStoreEvent }),
  });
  const retentionMs = engine.settings.retentionMs;
  // The timestamp window and the recorded id are the replay defence together: a captured delivery is
  // taken until its stamp is past the window (stamped up to `future` ahead, then `past` and the second
  // it starts), and only its id refuses it meanwhile. A shorter retention forgets the id while the
  // replay still passes the window, and it is applied again: no warning can make that right.
  const { pastMs, futureMs } = verifier.tolerance;
  if (retentionMs < pastMs + futureMs + 1000) {
    throw new TypeError(
      `retention (${retentionMs} ms) must outlast the timestamp tolerance (${pastMs} ms past, ${futureMs} ms future, and 1 s): a replayed delivery inside the window would be applied again`,
    );
  }
  const senderHorizonMs = toMilliseconds(options.senderHorizon ?? '76h', 'senderHorizon');
  const transactional = (options.transactional ?? true) && engine.transactional;
  const scope = options.scope ?? 'webhooks';
  if (typeof scope !== 'string' || scope.length === 0) throw new TypeError('scope must be a non-empty string');
  const onEvent = options.onEvent;

  if (retentionMs < senderHorizonMs) {
    const warning: ReceiverWarning = {
      code: 'retention_below_sender_horizon',
      message: `webhook retention (${retentionMs / 3_600_000}h) is shorter than the sender's retry horizon (${senderHorizonMs / 3_600_000}h): a late retry of an event will be applied again`,
    };
    if (options.onWarning) notify(options.onWarning, warning);
    else process.emitWarning(warning.message, { code: 'IDEM_WEBHOOK_RETENTION' });
  }

  if (typeof options.store === 'object' && options.store !== null) {
    const scopes = scopesInUse.get(options.store) ?? new Map<string, number>();
    scopesInUse.set(options.store, scopes);
    const receivers = (scopes.get(scope) ?? 0) + 1;
    scopes.set(scope, receivers);
    if (receivers === 2) {
      const warning: ReceiverWarning = {
        code: 'scope_shared',
        message: `two webhook receivers use one store with the same scope ('${scope}'): if they serve different endpoints, an event id delivered to both is applied only by the first. Give each endpoint its own scope option`,
      };
      if (options.onWarning) notify(options.onWarning, warning);
      else process.emitWarning(warning.message, { code: 'IDEM_WEBHOOK_SCOPE_SHARED' });
    }
  }

  // An observer must never break a delivery, whether it throws or rejects.
  const report = (event: ReceiverEvent) => notify(onEvent, event);

  const done = (
    response: ReceiverResponse,
    extra: { code?: WebhookErrorCode | IdempotencyErrorCode; error?: unknown } = {},
  ): ReceiverResponse => {
    report({
      type: response.outcome,
      at: now(),
      ...(response.id === undefined ? {} : { id: response.id }),
      ...(extra.code === undefined ? {} : { code: extra.code }),
      ...(extra.error === undefined ? {} : { error: extra.error }),
    });
    return response;
  };

  const ack = (id: string): ReceiverResponse => ({
    status: ACK.status,
    headers: { ...ACK.headers },
    body: ACK_BODY,
    outcome: 'applied',
    id,
  });

  const applyFailed = async (lease: Lease, id: string, error: unknown) => {
    // Forget the claim so the sender's retry applies the event; nothing of it was recorded.
    await engine.release(lease);
    // The database failed under `apply` (its `tx.query` lost the connection, timed out): the same
    // outage as the store failing first or at commit, and answered as those are, 503 with
    // Retry-After, so the sender retries later. Read as the core's HTTP adapters read a handler's
    // failure: a `StoreUnavailableError` (`isStoreUnavailableError`, by name, so another copy of
    // @idem/core raised it too), which the stores raise for exactly those failures. Anything else
    // is a bug: 500.
    if (isStoreUnavailableError(error)) {
      const unavailable = new IdempotencyError('store_unavailable', 'The webhook could not be applied; retry later.', {
        retryAfter: engine.settings.unavailableRetryAfter,
        cause: error,
      });
      return done(problemResponse(unavailable, 'unavailable', id), { code: unavailable.code, error });
    }
    return done(
      problemResponse(
        new WebhookError('apply_failed', 'The webhook could not be applied; it will be retried.', { cause: error }),
        'failed',
        id,
      ),
      { code: 'apply_failed', error },
    );
  };

  const handle = async (request: ReceiverRequest): Promise<ReceiverResponse> => {
    if (!request || typeof request !== 'object') throw new TypeError('handle needs { headers, body }');
    const body = toBodyBytes(request.body);
    const verified = verifier.verify({ headers: request.headers, body });
    // The error goes with the code: its details (the length of the body as received, never its bytes)
    // are what tell a trimmed or re-encoded body from a wrong secret in an operator's log.
    if (!verified.ok)
      return done(problemResponse(verified.error, 'rejected'), { code: verified.error.code, error: verified.error });
    const { id, timestamp } = verified.webhook;
    const fingerprint = createHash('sha256').update(body).digest('hex');
    const started = await engine.begin({ key: id, scope, operation: OPERATION, fingerprint });

    if (started.kind === 'replay') {
      const { response } = started;
      return done({
        status: response.status,
        headers: { ...response.headers, 'idempotent-replayed': 'true' },
        body: response.body,
        outcome: 'duplicate',
        id,
      });
    }
    if (started.kind === 'reject') {
      const { error } = started;
      if (error.code === 'in_progress') return done(problemResponse(error, 'in-progress', id), { code: error.code });
      // The engine's only mismatch here: its 400 `idempotency_error` comes with `mismatchStatus: 400`,
      // which the receiver never sets (nor takes as an option).
      if (error.code === 'fingerprint_mismatch') {
        const reused = new WebhookError(
          'event_id_reused',
          'This webhook id was already received with a different body; it is not applied.',
        );
        return done(problemResponse(reused, 'mismatch', id), { code: reused.code });
      }
      return done(problemResponse(error, 'unavailable', id), { code: error.code, error: error.cause });
    }

    const { lease } = started;
    const event: ReceivedEvent = {
      id,
      timestamp,
      body,
      scope,
      // A leading byte order mark is dropped (TextDecoder's default), as RFC 8259 lets a parser do:
      // JSON.parse refuses it, and the sender would retry a SyntaxError's 500 to its horizon.
      json: <T>() => JSON.parse(utf8.decode(body)) as T,
      // A getter: the lease makes its AbortController only when someone asks for it.
      get signal() {
        return lease.signal;
      },
      keyFor: (purpose: string) => downstreamKey(lease, purpose),
      recovered: lease.recovered,
    };

    if (transactional) {
      let result: Awaited<ReturnType<IdempotencyEngine['transaction']>>;
      try {
        result = await engine.transaction<undefined, Tx>(lease, async (tx) => {
          await options.apply(event, tx);
          return { value: undefined, response: ACK };
        });
      } catch (error) {
        return applyFailed(lease, id, error);
      }
      if (result.committed) return done(ack(id));
      // Rolled back: nothing of the effect happened. Lease lost means another delivery of the same
      // event now holds it; store failure means nobody does. Either way the sender must retry.
      report({ type: 'record-failed', id, reason: result.reason, at: now(), error: result.error });
      if (result.reason === 'lease-lost') {
        const busy = new IdempotencyError(
          'in_progress',
          'This webhook is being applied by another delivery; retry later.',
          {
            retryAfter: 1,
          },
        );
        return done(problemResponse(busy, 'in-progress', id), { code: busy.code });
      }
      const unavailable = new IdempotencyError('store_unavailable', 'The webhook could not be recorded; retry later.', {
        retryAfter: engine.settings.unavailableRetryAfter,
        cause: result.error,
      });
      return done(problemResponse(unavailable, 'unavailable', id), { code: unavailable.code, error: result.error });
    }

    try {
      await options.apply(event, undefined);
    } catch (error) {
      return applyFailed(lease, id, error);
    }
    const completed = await engine.complete(lease, ACK);
    if (!completed.ok) {
      // The effect happened but could not be recorded. Acknowledging is still right: answering with
      // an error would make the sender retry and apply it again for sure. Reported for alerting;
      // transactional mode closes this window.
      report({ type: 'record-failed', id, reason: completed.reason, at: now(), error: completed.error });
    }
    return done(ack(id));
  };

  const receiver: Receiver = {
    handle,
    engine,
    settings: Object.freeze({ retentionMs, senderHorizonMs, transactional, scope }),
  };
  glueReporters.set(receiver, (error) => report({ type: 'rejected', at: now(), code: error.code, error }));
  return receiver;
}
