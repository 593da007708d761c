import { type Duration, toMilliseconds } from './duration.js';
import { completionRetryPause, completionRetryPauses } from './engine-hooks.js';
import type { IdempotencyEvent } from './events.js';
import type { ListsEvery } from './option-names.js';
import { type OutcomePolicy, resolveOutcomePolicy } from './outcome-policy.js';
import type { Store } from './store.js';

export const DAY_MS = 86_400_000;
// Upper bounds that keep every duration inside what stores and timers take. Past them, Redis gets a
// `PX` of `1e+21`, PostgreSQL an interval out of range (every request a 503), and a heartbeat of a
// quarter lease over 2^31 ms, which Node runs every millisecond.
export const MAX_RETENTION_MS = 3650 * DAY_MS;
export const MAX_LEASE_MS = 7 * DAY_MS;

/** Options of {@link createIdempotency}. */
export interface IdempotencyOptions {
  /** Where records live. */
  store: Store;
  /**
   * How long a completed outcome is kept and replayed. Default `'24h'` (spec part 8). Shorter needs
   * `acknowledgeShortRetention: true`: retention must outlive the client's retry horizon, or a late
   * retry executes again.
   */
  retention?: Duration | undefined;
  /** Set to true to allow `retention` below 24 hours. */
  acknowledgeShortRetention?: boolean | undefined;
  /**
   * How long a claim lives without renewal. Default `'10s'`. While the handler runs the lease is
   * renewed every third of this, so a crashed executor's key is abandoned after one lease: a retry
   * with the same request takes it over, and other requests under the key are refused for the
   * retention.
   */
  lease?: Duration | undefined;
  /**
   * Renew leases in the background while a handler runs. Default true: one shared timer renews every
   * lease of the engine. `'per-lease'`: each claim sets its own renewal timer, in the request that
   * claimed; for runtimes that run a timer only while the request that set it is alive (Cloudflare
   * Workers, where it is the default), on which a shared timer dies with the request that started
   * it. Off (for tests), a handler that runs longer than one lease is taken for crashed: a retry may
   * take its key over.
   */
  heartbeat?: boolean | 'per-lease' | undefined;
  /**
   * The longest a handler may hold its key. Default off: a handler that never settles keeps its
   * key in progress (409) for as long as its process lives. When set, the heartbeat stops renewing
   * a lease this old: the lease is marked lost (its `signal` aborts, a `lease-lost` event says
   * `max-execution`), and the key is free for a retry once the store lets the lease run out, within
   * one `lease` more. A handler that finishes within that lease still has its outcome stored; later,
   * it is a late finisher like a stalled executor's, refused by the store (`lease-lost`), and its
   * response is served but not stored. Set it above your slowest legitimate handler: a retry after
   * it runs the operation again. Over HTTP the execution lasts until the response is ended, so the
   * time a streamed body waits on a client that reads it slowly counts too. Needs the heartbeat.
   */
  maxExecution?: Duration | false | undefined;
  /**
   * How long a request that finds its key in progress waits for the first one's outcome before it
   * gets 409. Default off (answer 409 at once, as the spec says). The store calls made while waiting
   * keep their own `storeTimeout`: with a slow store, the answer can come up to that much later.
   */
  wait?: Duration | false | undefined;
  /** Which outcomes are stored. Default `'all'`. See {@link OutcomePolicy}. */
  storeOutcome?: OutcomePolicy | undefined;
  /** Status for "same key, other request": 422 (default) or 400 with code `idempotency_error` (spec part 7). */
  mismatchStatus?: 422 | 400 | undefined;
  /** Longest time one store operation may take before the request gets 503. Default `'2s'`. */
  storeTimeout?: Duration | undefined;
  /** Seconds in `Retry-After` on 409. Default 1. */
  conflictRetryAfter?: number | undefined;
  /** Seconds in `Retry-After` on 503. Default 2. */
  unavailableRetryAfter?: number | undefined;
  /** Called for every state change, with timings. What it throws or rejects with is swallowed. */
  onEvent?: ((event: IdempotencyEvent) => void) | undefined;
  /**
   * Clock (epoch ms). Default: `Date.now` stamps events, and a monotonic clock times renewals,
   * `maxExecution`, `wait`, `storeTimeout` and the replay cache, so a wall clock stepped by NTP or a
   * resumed VM moves none of them. An injected clock drives both (tests, simulations). Lease and
   * retention are timed by the store.
   */
  now?: (() => number) | undefined;
  /**
   * For a store that other processes share (Redis, PostgreSQL): keep each completed outcome read
   * from the store or written to it in this process for `ttl`, up to `entries` of them (default
   * 10,000), and answer repeats of those keys from there, a mismatch (422) included. A hot key's
   * replays then cost no store round trip, as Powertools' local cache spares its warm hits. A
   * completed record only changes by going away, so what it costs is that a replay can still come
   * up to `ttl` after the store forgot the key (its retention ended, or an operator deleted it);
   * keep it short: `'1s'` takes a key hit a thousand times a second down to one store read a
   * second. At most `'1h'`. Default off; the memory store answers at once and takes none.
   */
  replayCache?: { ttl: Duration; entries?: number | undefined } | false | undefined;
}

/** Every name {@link IdempotencyOptions} has; the type check below keeps the list complete. */
export const engineOptionNames = [
  'store',
  'retention',
  'acknowledgeShortRetention',
  'lease',
  'heartbeat',
  'maxExecution',
  'wait',
  'storeOutcome',
  'mismatchStatus',
  'storeTimeout',
  'conflictRetryAfter',
  'unavailableRetryAfter',
  'onEvent',
  'now',
  'replayCache',
] as const satisfies readonly (keyof IdempotencyOptions)[];
const everyEngineOptionNamed: ListsEvery<IdempotencyOptions, typeof engineOptionNames> = true;
void everyEngineOptionNamed;
export const knownEngineOptions: ReadonlySet<string> = new Set(engineOptionNames);

/**
 * True on Cloudflare Workers, which documents `navigator.userAgent` as `'Cloudflare-Workers'` for
 * telling it apart: there a timer runs only while the request that set it is alive, so the shared
 * heartbeat, started by whichever request claimed first, would stop renewing with that request.
 */
export function requestScopedTimers(): boolean {
  const agent = (globalThis as { navigator?: { userAgent?: unknown } }).navigator?.userAgent;
  return agent === 'Cloudflare-Workers';
}

// Sent as `Retry-After`, whose value is delay-seconds, digits only (RFC 9110, 10.2.3): '1s', 1.5, -1
// or NaN would go on the wire as a field no client can read.
export function delaySeconds(value: unknown, fallback: number, name: string): number {
  if (value === undefined) return fallback;
  if (!Number.isSafeInteger(value) || (value as number) < 0) {
    throw new TypeError(`${name} must be a whole number of seconds, at least 0 (it is sent as Retry-After)`);
  }
  return value as number;
}

// The global's, read at each call (not node:perf_hooks' object): fake timers replace the global.
const monotonicNow = () => performance.now();

/**
 * The engine's options, checked and with their defaults, durations in milliseconds. Throws a
 * TypeError for the first one that is wrong, at construction: a bad option found at the first
 * request would fail it as a 500.
 */
export function engineSettings(options: IdempotencyOptions) {
  const { store } = options;
  const contract = ['claim', 'renew', 'complete', 'release', 'get'] as const;
  const missing = store ? contract.filter((method) => typeof store[method] !== 'function') : contract;
  if (missing.length > 0) {
    throw new TypeError(
      `store must implement the Store contract (claim, renew, complete, release, get); missing: ${missing.join(', ')}`,
    );
  }
  const retentionMs = toMilliseconds(options.retention ?? '24h', 'retention');
  if (retentionMs < DAY_MS && options.acknowledgeShortRetention !== true) {
    throw new TypeError(
      'retention below 24h lets a late retry execute again (spec part 8); set acknowledgeShortRetention: true if that is intended',
    );
  }
  if (retentionMs > MAX_RETENTION_MS) throw new TypeError('retention must be at most 3650d');
  const leaseMs = toMilliseconds(options.lease ?? '10s', 'lease');
  if (leaseMs < 100) throw new TypeError('lease must be at least 100ms');
  if (leaseMs > MAX_LEASE_MS) throw new TypeError('lease must be at most 7d');
  const waitMs = options.wait === undefined || options.wait === false ? 0 : toMilliseconds(options.wait, 'wait');
  const storeTimeoutMs = toMilliseconds(options.storeTimeout ?? '2s', 'storeTimeout');
  // 0 is no "no timeout": every call to a shared store would time out, every request a 503.
  if (storeTimeoutMs < 1) throw new TypeError('storeTimeout must be at least 1ms');
  const mismatchStatus = options.mismatchStatus ?? 422;
  if (mismatchStatus !== 422 && mismatchStatus !== 400) throw new TypeError('mismatchStatus must be 422 or 400');
  const policy = resolveOutcomePolicy(options.storeOutcome ?? 'all');
  const heartbeat = options.heartbeat ?? (requestScopedTimers() ? 'per-lease' : true);
  if (typeof heartbeat !== 'boolean' && heartbeat !== 'per-lease')
    throw new TypeError("heartbeat must be a boolean or 'per-lease'");
  const perLease = heartbeat === 'per-lease';
  const maxExecution = options.maxExecution ?? false;
  const maxExecutionMs = maxExecution === false ? 0 : toMilliseconds(maxExecution, 'maxExecution');
  if (maxExecution !== false) {
    if (maxExecutionMs < 100) throw new TypeError('maxExecution must be at least 100ms');
    // Without renewals a lease already ends after one lease: a cap on renewals would mean nothing.
    if (!heartbeat) throw new TypeError('maxExecution needs the heartbeat (heartbeat: false already ends every lease)');
  }
  const conflictRetryAfter = delaySeconds(options.conflictRetryAfter, 1, 'conflictRetryAfter');
  const unavailableRetryAfter = delaySeconds(options.unavailableRetryAfter, 2, 'unavailableRetryAfter');
  const now = options.now ?? Date.now;
  // A clock that is no function would only fail at the first request, as a 500.
  if (typeof now !== 'function') throw new TypeError('now must be a function returning epoch milliseconds');
  // Intervals (lease renewals, maxExecution, wait, store deadlines, the replay cache's ttl, event
  // durations) are measured on a monotonic clock: the wall clock steps (NTP, a VM resumed, an
  // operator's `date -s`), and an hour back would stop every renewal for an hour (another process
  // then takes a running key over), an hour forward give up on every handler. An injected `now`
  // (tests, simulations) drives both; `now` alone stamps events.
  const elapsed = options.now ?? monotonicNow;
  const injectedPause: unknown = (options as { [completionRetryPauses]?: unknown })[completionRetryPauses];
  if (injectedPause !== undefined && typeof injectedPause !== 'function')
    throw new TypeError('the completion retry pauses must be a function of the attempt');
  const retryPause = (injectedPause as ((attempt: number) => number) | undefined) ?? completionRetryPause;
  const onEvent = options.onEvent;
  if (onEvent !== undefined && typeof onEvent !== 'function') throw new TypeError('onEvent must be a function');
  return {
    store,
    retentionMs,
    leaseMs,
    waitMs,
    storeTimeoutMs,
    mismatchStatus,
    policy,
    heartbeat,
    perLease,
    maxExecutionMs,
    conflictRetryAfter,
    unavailableRetryAfter,
    now,
    elapsed,
    retryPause,
    onEvent,
  };
}
