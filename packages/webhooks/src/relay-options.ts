import { randomUUID } from 'node:crypto';
import { maxTimerMs } from '@idem/client';
import { assertKnownOptions, type Duration, type ListsEvery, toMilliseconds } from '@idem/core';
import type { Queryable } from './queryable.js';
import type { AttemptRecord, Sender } from './sender.js';

/** Options of {@link Outbox.relay}. */
export interface RelayOptions {
  /** Where the relay reads and updates rows: a `pg` Pool (or any {@link Queryable}). */
  db: Queryable;
  /** Delivers and signs; its schedule (backoff, horizon, max attempts) is the outbox's schedule. */
  sender: Sender;
  /**
   * How many rows the relay works on at once: `runOnce()` claims up to this many, and the `start()`
   * loop keeps up to this many attempts in flight, claiming again as soon as one ends. Default 10.
   */
  batchSize?: number | undefined;
  /**
   * How many of those may be one URL's at once (its share): a backlog for one endpoint, a dead one
   * that makes every attempt wait out the timeout or a slow one, never takes more, and the other
   * endpoints' events go out through the rest. A positive integer up to `batchSize`; default half
   * of `batchSize` (at least 1). Counted per relay: with several relays, an endpoint may get one
   * share from each.
   */
  maxPerUrl?: number | undefined;
  /**
   * How long a claimed row stays reserved for this relay. A relay that dies mid-delivery frees its rows
   * after this. Must exceed the sender's per-attempt timeout. Default: the timeout plus 15 s.
   */
  lease?: Duration | undefined;
  /**
   * The `start()` loop's pause after a claim that found nothing more due (or failed), before it claims
   * again; a slot that frees ends it sooner. Default `'1s'`.
   */
  pollInterval?: Duration | undefined;
  /** Identifies this relay in `locked_by`. Default a random UUID. */
  relayId?: string | undefined;
  /** Called after every attempt. What it throws or rejects with is swallowed. */
  onAttempt?: ((row: { id: string; url: string }, attempt: AttemptRecord) => void) | undefined;
  /**
   * Called when a claim or a row's work in the background loop (`start()`) fails, e.g. the database is
   * down, and when a hold of a throttling URL or a 410's dead-lettering fails; the loop goes on (after
   * `pollInterval` for a claim). Without it such failures are silent. What it throws or rejects with
   * is swallowed.
   */
  onError?: ((error: unknown) => void) | undefined;
}

const relayOptionNames = [
  'db',
  'sender',
  'batchSize',
  'maxPerUrl',
  'lease',
  'pollInterval',
  'relayId',
  'onAttempt',
  'onError',
] as const satisfies readonly (keyof RelayOptions)[];
const relayOptionNamesAll: ListsEvery<RelayOptions, typeof relayOptionNames> = true;
void relayOptionNamesAll;

/** A relay's options, checked, with their defaults, and the table (quoted) it works on. */
export type RelaySettings = ReturnType<typeof resolveRelayOptions>;

/** Checks a relay's options (a `TypeError` for a bad one) and fills in their defaults. */
export function resolveRelayOptions(table: string, relayOptions: RelayOptions) {
  if (!relayOptions || typeof relayOptions !== 'object') throw new TypeError('relay needs an options object');
  assertKnownOptions(relayOptions, new Set(relayOptionNames), 'relay');
  const { db, sender } = relayOptions;
  if (!db || typeof db.query !== 'function') throw new TypeError('relay needs db (a pg Pool or client)');
  if (!sender || typeof sender.attempt !== 'function') throw new TypeError('relay needs a sender');
  const batchSize = relayOptions.batchSize ?? 10;
  // A safe integer: pg would send 1e21 as "1e+21", which LIMIT refuses in every round.
  if (!Number.isSafeInteger(batchSize) || batchSize < 1)
    throw new TypeError(`batchSize must be a positive safe integer (at most ${Number.MAX_SAFE_INTEGER})`);
  // Half the slots by default: an endpoint that hangs keeps at most half of them for its timeout,
  // and the other endpoints' events go out through the rest.
  const maxPerUrl = relayOptions.maxPerUrl ?? Math.max(1, Math.floor(batchSize / 2));
  if (!Number.isSafeInteger(maxPerUrl) || maxPerUrl < 1 || maxPerUrl > batchSize)
    throw new TypeError('maxPerUrl must be a positive integer, at most batchSize');
  // By default the sender's timeout and 15 s, within the longest timer (see below): a timeout
  // near that limit must not make relay() refuse a `lease` nobody gave.
  const leaseMs =
    relayOptions.lease === undefined
      ? Math.min(sender.schedule.timeoutMs + 15_000, maxTimerMs)
      : toMilliseconds(relayOptions.lease, 'lease');
  if (leaseMs <= sender.schedule.timeoutMs)
    throw new TypeError(
      relayOptions.lease === undefined
        ? `the sender's timeout leaves no room for the relay's lease (at most ${maxTimerMs} ms): shorten it`
        : "lease must be longer than the sender's per-attempt timeout",
    );
  // A round is given up after its lease by a timer, which fires at once past Node's limit: every
  // round would fail with relay_round_timeout.
  if (leaseMs > maxTimerMs)
    throw new TypeError('lease must be at most 2147483647 ms (about 24.9 days, the longest timer Node keeps)');
  const pollMs = toMilliseconds(relayOptions.pollInterval ?? '1s', 'pollInterval');
  // 0 would query the database back to back, without a pause, for as long as the outbox is idle.
  if (pollMs < 10) throw new TypeError('pollInterval must be at least 10ms');
  const relayId = relayOptions.relayId ?? randomUUID();
  const { horizonMs, maxAttempts } = sender.schedule;
  const horizonParam = Number.isFinite(horizonMs) ? horizonMs : 1e15;
  const maxAttemptsParam = Number.isFinite(maxAttempts) ? maxAttempts : null;
  return {
    table,
    relayOptions,
    db,
    sender,
    batchSize,
    maxPerUrl,
    leaseMs,
    pollMs,
    relayId,
    maxAttempts,
    horizonParam,
    maxAttemptsParam,
  };
}
