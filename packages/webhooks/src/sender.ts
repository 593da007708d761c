import { abortableSleep, lateTimeout, maxTimerMs, retryAfterOf } from '@idem/client';
import { assertKnownOptions, type Duration, type ListsEvery, notify, toMilliseconds } from '@idem/core';
import { type BackoffOptions, createBackoff } from './backoff.js';
import { toBodyBytes, type WebhookBody } from './body.js';
import { assertDeliverable, assertSendableHeaders } from './deliverable.js';
import type { WebhookSecret } from './secrets.js';
import { createSigner } from './signature.js';

/** One event to deliver to one endpoint. */
export interface WebhookMessage {
  /** The endpoint. Redirects are not followed: a 3xx is a failed attempt. */
  url: string | URL;
  /** The event id, sent as `webhook-id` on every attempt: the receiver's idempotency key. */
  id: string;
  /** The exact bytes to send. */
  body: WebhookBody;
  /** Default `application/json`. */
  contentType?: string | undefined;
  /**
   * Extra headers for this message, over the sender's `headers`. Names are case-insensitive.
   * `content-type` (see `contentType`) and the signer's `webhook-id`, `webhook-timestamp` and
   * `webhook-signature` are always ours, and `content-length` is counted from the body: given here,
   * in any case, they are a `TypeError`.
   */
  headers?: Record<string, string> | undefined;
}

/** The retry schedule of a {@link createSender}. */
export interface ScheduleOptions extends BackoffOptions {
  /** Most attempts in all, the first included. Default unlimited (the horizon ends the retries). */
  maxAttempts?: number | undefined;
  /**
   * No attempt starts later than this after the first one. Default `'24h'`. Receivers must keep event
   * ids at least this long (their retention), or a late retry is applied twice.
   */
  horizon?: Duration | undefined;
  /**
   * The longest `Retry-After` honoured. A larger value is cut to this, so an endpoint cannot park a
   * message forever. Default: the backoff cap.
   */
  maxRetryAfter?: Duration | undefined;
}

const scheduleOptionNames = [
  'base',
  'cap',
  'factor',
  'maxAttempts',
  'horizon',
  'maxRetryAfter',
] as const satisfies readonly (keyof ScheduleOptions)[];
const scheduleOptionNamesAll: ListsEvery<ScheduleOptions, typeof scheduleOptionNames> = true;
void scheduleOptionNamesAll;

/** Options of {@link createSender}. */
export interface SenderOptions {
  /** Signing secret(s): `whsec_...` for v1, `whsk_...` for v1a; several sign with each. */
  secret: WebhookSecret | readonly WebhookSecret[];
  /** Default `globalThis.fetch`. */
  fetch?: typeof fetch | undefined;
  schedule?: ScheduleOptions | undefined;
  /** Per-attempt limit, covering the response head and the first KiB of its body. Default `'15s'`. */
  timeout?: Duration | undefined;
  /** Source of jitter in [0, 1). Default `Math.random`; inject {@link seededRandom} in tests. */
  random?: (() => number) | undefined;
  /**
   * Waits between attempts. Default: timers that an abort signal cancels, in steps for waits longer
   * than one timer holds.
   */
  sleep?: ((ms: number, signal?: AbortSignal) => Promise<void>) | undefined;
  /**
   * Clock, epoch milliseconds. Default: `Date.now` signs timestamps, and a monotonic clock measures
   * the horizon and attempt durations (a stepped wall clock moves neither). An injected one does all.
   */
  now?: (() => number) | undefined;
  /** Headers sent with every message, e.g. `user-agent`; not `content-type`, `content-length` nor the signer's `webhook-*` three. */
  headers?: Record<string, string> | undefined;
  /** Called after every attempt, for logs and metrics. What it throws or rejects with is swallowed. */
  onAttempt?: ((attempt: AttemptRecord, message: WebhookMessage) => void) | undefined;
}

const senderOptionNames = [
  'secret',
  'fetch',
  'schedule',
  'timeout',
  'random',
  'sleep',
  'now',
  'headers',
  'onAttempt',
] as const satisfies readonly (keyof SenderOptions)[];
const senderOptionNamesAll: ListsEvery<SenderOptions, typeof senderOptionNames> = true;
void senderOptionNamesAll;

/** What happened in one attempt. */
export interface AttemptRecord {
  /** 1 for the first attempt. */
  attempt: number;
  /** When it started, epoch ms (sender clock). */
  startedAt: number;
  /** The signed `webhook-timestamp`, Unix seconds: fresh on every attempt. */
  timestamp: number;
  durationMs: number;
  /**
   * - `delivered`: a 2xx.
   * - `gone`: 410; the endpoint asked never to be called again.
   * - `failed`: any other status (3xx included: redirects are not followed).
   * - `timeout`: no response within the per-attempt timeout.
   * - `network-error`: the connection failed or broke.
   */
  result: 'delivered' | 'gone' | 'failed' | 'timeout' | 'network-error';
  status?: number;
  /** The `Retry-After` the endpoint asked for, in ms. */
  retryAfterMs?: number;
  /** The first KiB of the response body, as text, for the dead-letter record. */
  responseBody?: string;
  /** A short description of a network error. */
  error?: string;
  /** How long the sender waited after this attempt before the next one. */
  waitMs?: number;
}

/** Why a message was given up. */
export type DeadLetterReason = 'gone' | 'max-attempts' | 'horizon' | 'aborted';

/** The outcome of {@link Sender.send}: a value for every expected end, never an exception. */
export type DeliveryResult =
  | { outcome: 'delivered'; id: string; attempts: AttemptRecord[] }
  | {
      outcome: 'dead-letter';
      id: string;
      reason: DeadLetterReason;
      attempts: AttemptRecord[];
      lastAttempt: AttemptRecord | undefined;
    };

/** Options of one {@link Sender.attempt}. */
export interface AttemptOptions {
  /** Ends the attempt (recorded as a network error). */
  signal?: AbortSignal | undefined;
  /**
   * The clock (epoch ms) that signs this attempt (`webhook-timestamp`), dates it (`startedAt`) and
   * reads an HTTP-date `Retry-After` that comes without a `Date`. Default: the sender's `now`.
   */
  now?: (() => number) | undefined;
}

/** A retrying Standard Webhooks sender. */
export interface Sender {
  /**
   * Delivers `message` until a 2xx, with full-jitter exponential backoff, `Retry-After`, a stop on 410,
   * a fresh signature per attempt, and a dead-letter outcome carrying every attempt.
   */
  send(message: WebhookMessage, options?: { signal?: AbortSignal | undefined }): Promise<DeliveryResult>;
  /**
   * Makes exactly one signed attempt (a relay schedules the retries itself). `now` replaces the
   * sender's clock for this attempt: the relay signs by the database's clock, as it schedules.
   */
  attempt(message: WebhookMessage, attempt: number, options?: AttemptOptions): Promise<AttemptRecord>;
  /**
   * The wait before retry `retry` (1 = after the first attempt): a full-jitter draw, raised to
   * `Retry-After` when that is larger (cut to `maxRetryAfter`).
   */
  nextDelay(retry: number, retryAfterMs?: number): number;
  /** The resolved schedule, in milliseconds. */
  readonly schedule: Readonly<{
    baseMs: number;
    capMs: number;
    maxAttempts: number;
    horizonMs: number;
    maxRetryAfterMs: number;
    timeoutMs: number;
  }>;
}

const RESPONSE_SNIPPET_BYTES = 1024;

/**
 * Header names are case-insensitive, but fetch appends (never replaces) names that differ only in
 * case: a caller's `Content-Type` or `Webhook-Signature` beside ours would go out as one combined
 * value, breaking the content type or every signature. Lower-cased names let the later source win.
 */
function lowerCaseNames(headers: Record<string, string>): Record<string, string> {
  const lowered: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    const lower = name.toLowerCase();
    // fetch counts the body itself: a caller's length can only agree with it, or make undici refuse
    // every attempt (a body length that does not match), so it is never sent. send(), createSender()
    // and outbox.add() refuse it; a row an earlier version stored may hold it, and attempt() sends
    // that row as before.
    if (lower !== 'content-length') lowered[lower] = value;
  }
  return lowered;
}

/**
 * The first KiB of the body, or what of it arrived before the read failed (the attempt's timeout, a
 * connection cut): "database is down" from a receiver that then stalls is what the dead letter needs.
 */
async function readSnippet(response: Response): Promise<string> {
  if (!response.body) return '';
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    while (size < RESPONSE_SNIPPET_BYTES) {
      const { done, value } = await reader.read();
      if (done) break;
      chunks.push(value);
      size += value.length;
    }
  } catch {
    // Keep what was read.
  } finally {
    // Release the connection without downloading the rest of a large error page.
    await reader.cancel().catch(() => undefined);
  }
  return Buffer.concat(chunks).subarray(0, RESPONSE_SNIPPET_BYTES).toString('utf8');
}

/**
 * Creates a sender that POSTs signed events until they are acknowledged.
 *
 * Schedule: attempt 1 at once; before retry n a wait drawn from `[0, min(cap, base * 2^(n-1)))`
 * (about 1 s, 2 s, 4 s, ... randomized), or the endpoint's `Retry-After` when larger. A 410 stops at
 * once; the horizon and `maxAttempts` end the retries with a dead-letter outcome.
 *
 * @example
 * const sender = createSender({ secret: process.env.WEBHOOK_SECRET!, schedule: { cap: '10m', horizon: '24h' } });
 * const result = await sender.send({ url: 'https://example.com/hooks', id: 'evt_1', body: JSON.stringify(event) });
 * if (result.outcome === 'dead-letter') await saveForReplay(result);
 */
export function createSender(options: SenderOptions): Sender {
  if (!options || typeof options !== 'object') throw new TypeError('createSender needs an options object');
  // The retry settings live in `schedule`; at the top level the nearest name would be a wrong hint.
  const misplaced = Object.keys(options).find((name) => (scheduleOptionNames as readonly string[]).includes(name));
  if (misplaced !== undefined) {
    throw new TypeError(`createSender: ${misplaced} belongs in schedule: createSender({ schedule: { ${misplaced} } })`);
  }
  assertKnownOptions(options, new Set(senderOptionNames), 'createSender');
  const signer = createSigner({ secret: options.secret });
  const fetchImpl = options.fetch ?? globalThis.fetch;
  if (typeof fetchImpl !== 'function') throw new TypeError('fetch must be a function');
  const schedule = options.schedule ?? {};
  if (schedule === null || typeof schedule !== 'object') throw new TypeError('schedule must be an object');
  assertKnownOptions(schedule, new Set(scheduleOptionNames), 'schedule');
  const backoff = createBackoff(schedule);
  const maxAttempts = schedule.maxAttempts ?? Number.POSITIVE_INFINITY;
  if (!(maxAttempts >= 1) || (Number.isFinite(maxAttempts) && !Number.isInteger(maxAttempts))) {
    throw new TypeError('maxAttempts must be a positive integer');
  }
  const horizonMs = toMilliseconds(schedule.horizon ?? '24h', 'horizon');
  const maxRetryAfterMs =
    schedule.maxRetryAfter === undefined ? backoff.capMs : toMilliseconds(schedule.maxRetryAfter, 'maxRetryAfter');
  const timeoutMs = toMilliseconds(options.timeout ?? '15s', 'timeout');
  if (timeoutMs <= 0) throw new TypeError('timeout must be positive');
  // Its timer would fire at once, and every attempt would be a timeout.
  if (timeoutMs > maxTimerMs) throw new TypeError('timeout must be at most 2147483647 ms (about 24.9 days)');
  const random = options.random ?? Math.random;
  // Waits longer than one timer holds (about 24.9 days) are taken in steps: any cap works.
  const sleep = options.sleep ?? abortableSleep;
  const now = options.now ?? Date.now;
  // The horizon and attempt durations on a monotonic clock: a wall clock stepped forward by an hour
  // would dead-letter every event in retry at once. An injected `now` drives both.
  const elapsed = options.now ?? (() => performance.now());
  // Refused now rather than failing every attempt of every message.
  assertSendableHeaders(options.headers);
  const baseHeaders = lowerCaseNames(options.headers ?? {});
  const onAttempt = options.onAttempt;

  const nextDelay = (retry: number, retryAfterMs?: number) => {
    const jittered = backoff.delay(retry, random);
    if (retryAfterMs === undefined) return jittered;
    // However large the request (delay-seconds of any length parse, up to Infinity), it is cut to
    // the cap: the endpoint asking for the longest wait gets the longest one allowed, not none.
    return Math.max(jittered, Math.min(retryAfterMs, maxRetryAfterMs));
  };

  // An observer must never break a delivery, whether it throws or rejects. It gets its own copy,
  // made once the record is final: send() adds the wait that follows before it tells.
  const tell = (record: AttemptRecord, message: WebhookMessage) => notify(onAttempt, { ...record }, message);

  const attemptQuietly = async (
    message: WebhookMessage,
    number: number,
    attemptOptions: AttemptOptions = {},
  ): Promise<AttemptRecord> => {
    const clock = attemptOptions.now ?? now;
    const startedAt = clock();
    const begunAt = elapsed();
    const timestamp = Math.floor(startedAt / 1000);
    const body = toBodyBytes(message.body);
    // Signed now, for this attempt: a stored first attempt replayed later would fail any receiver's
    // timestamp tolerance.
    const signed = signer.sign({ id: message.id, body, timestamp });
    const controller = new AbortController();
    // One turn late (see lateTimeout): a 2xx that reached a frozen sender during the freeze counts,
    // instead of the delivered event being recorded as a timeout and sent again.
    const cancelTimeout = lateTimeout(timeoutMs, () => controller.abort(new Error('attempt timed out')));
    const outer = attemptOptions.signal;
    const forward = () => controller.abort(outer?.reason);
    outer?.addEventListener('abort', forward, { once: true });
    // An abort event never comes for a signal aborted already: without this the request went out.
    if (outer?.aborted) forward();
    const finish = (
      record: Omit<AttemptRecord, 'attempt' | 'startedAt' | 'timestamp' | 'durationMs'>,
    ): AttemptRecord => ({ attempt: number, startedAt, timestamp, durationMs: elapsed() - begunAt, ...record });
    try {
      const response = await fetchImpl(message.url, {
        method: 'POST',
        redirect: 'manual',
        signal: controller.signal,
        headers: {
          ...baseHeaders,
          ...lowerCaseNames(message.headers ?? {}),
          'content-type': message.contentType ?? 'application/json',
          ...signed,
        },
        body: new Uint8Array(body),
      });
      const status = response.status;
      const retryAfterMs = retryAfterOf(response.headers, clock());
      const responseBody = await readSnippet(response);
      const result = status >= 200 && status < 300 ? 'delivered' : status === 410 ? 'gone' : 'failed';
      return finish({ result, status, responseBody, ...(retryAfterMs === undefined ? {} : { retryAfterMs }) });
    } catch (error) {
      if (controller.signal.aborted && !outer?.aborted)
        return finish({ result: 'timeout', error: `no response within ${timeoutMs}ms` });
      if (outer?.aborted) return finish({ result: 'network-error', error: 'aborted by the caller' });
      // A custom fetch may reject with anything, `undefined` included: read it without assuming an Error.
      const cause = (error as { cause?: { code?: string } } | null | undefined)?.cause;
      return finish({
        result: 'network-error',
        error: cause?.code ?? (error as Error | null | undefined)?.name ?? 'network error',
      });
    } finally {
      cancelTimeout();
      outer?.removeEventListener('abort', forward);
    }
  };

  const attempt = async (
    message: WebhookMessage,
    number: number,
    attemptOptions: AttemptOptions = {},
  ): Promise<AttemptRecord> => {
    if (attemptOptions.now !== undefined && typeof attemptOptions.now !== 'function') {
      throw new TypeError('attempt(): `now` must be a function returning epoch milliseconds');
    }
    assertBodyBytes(message.body);
    const record = await attemptQuietly(message, number, attemptOptions);
    tell(record, message);
    return record;
  };

  const send = async (
    message: WebhookMessage,
    sendOptions: { signal?: AbortSignal | undefined } = {},
  ): Promise<DeliveryResult> => {
    if (!message || typeof message !== 'object') throw new TypeError('send needs a message');
    // A message no attempt could send is the caller's bug: thrown now, not retried until the horizon.
    assertDeliverable(message);
    assertBodyBytes(message.body);
    const signal = sendOptions.signal;
    const attempts: AttemptRecord[] = [];
    const firstAt = elapsed();
    const deadLetter = (reason: DeadLetterReason): DeliveryResult => ({
      outcome: 'dead-letter',
      id: message.id,
      reason,
      attempts,
      lastAttempt: attempts.at(-1),
    });
    for (let number = 1; ; number++) {
      if (signal?.aborted) return deadLetter('aborted');
      const record = await attemptQuietly(message, number, signal ? { signal } : {});
      attempts.push(record);
      if (record.result === 'delivered') {
        tell(record, message);
        return { outcome: 'delivered', id: message.id, attempts };
      }
      const reason: DeadLetterReason | undefined =
        record.result === 'gone'
          ? 'gone'
          : signal?.aborted
            ? 'aborted'
            : number >= maxAttempts
              ? 'max-attempts'
              : undefined;
      if (reason !== undefined) {
        tell(record, message);
        return deadLetter(reason);
      }
      const wait = nextDelay(number, record.retryAfterMs);
      // Give up rather than start an attempt past the horizon that receivers were promised.
      if (elapsed() + wait - firstAt > horizonMs) {
        tell(record, message);
        return deadLetter('horizon');
      }
      record.waitMs = wait;
      tell(record, message);
      try {
        await sleep(wait, signal);
      } catch {
        return deadLetter('aborted');
      }
    }
  };

  return {
    send,
    attempt,
    nextDelay,
    schedule: Object.freeze({
      baseMs: backoff.baseMs,
      capMs: backoff.capMs,
      maxAttempts,
      horizonMs,
      maxRetryAfterMs,
      timeoutMs,
    }),
  };
}

/**
 * The signature is over the exact bytes sent, so a message carries them: bytes or a string. An object
 * (which `outbox.add()` serialises for its caller) or no body is the caller's mistake, a `TypeError`
 * before any request, not the receiver's `raw_body_required` from inside the first attempt.
 */
function assertBodyBytes(body: unknown): void {
  if (typeof body === 'string' || body instanceof Uint8Array || body instanceof ArrayBuffer) return;
  throw new TypeError(
    'body must be the bytes to send: a string, a Uint8Array or an ArrayBuffer (JSON.stringify an object first)',
  );
}
