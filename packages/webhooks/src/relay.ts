import { notify, withoutCommandValues } from '@idem/core';
import { WebhookError } from './errors.js';
import type { LostAttempt } from './outbox-row.js';
import { type Claimed, createClaim } from './relay-claim.js';
import { type RelayOptions, resolveRelayOptions } from './relay-options.js';
import { createResults } from './relay-results.js';
import { runSlots } from './relay-slots.js';
import { createUrlWrites } from './relay-url-writes.js';

/** What one relay round did. */
export interface RelayRound {
  /** Rows this round claimed. */
  claimed: number;
  delivered: number;
  /**
   * Rows left pending for a later attempt: after a failed attempt, or taken over from a relay that
   * died mid-attempt and put back after a backoff wait without a new attempt.
   */
  retrying: number;
  /** Rows dead-lettered, including the other rows of a URL that answered 410. */
  dead: number;
  /**
   * Results refused because this relay's lease ran out and another claim took the row over: that
   * claim's outcome stands, and this round changed nothing for the row.
   */
  fenced: number;
}

/** A relay process loop. */
export interface Relay {
  /**
   * Claims due rows (FOR UPDATE SKIP LOCKED), makes one attempt each, records the results. A row
   * whose previous claim never recorded a result (its relay died mid-attempt) gets no attempt, and its
   * body is not even read: the claim appends a {@link LostAttempt} to its history, and the row is put
   * back after a backoff wait, as after a failed attempt, or dead-lettered if that claim used up the
   * last attempt or the wait would pass the horizon. A row already at `maxAttempts`, or attempted
   * before and already past the horizon, is dead-lettered by the claim itself, unread. If a row
   * fails (the database, a custom sender), it rejects with that error, but only once every other row
   * of the round is settled. A round that outlives its lease rejects with `relay_round_timeout`
   * (what it does after that counts for nothing, and it finishes in the background).
   */
  runOnce(): Promise<RelayRound>;
  /** Starts polling in the background. */
  start(): void;
  /**
   * Stops claiming and waits for the attempts in flight, each at most until its lease ends. A hold of
   * a throttling URL (or a 410's dead-lettering) they started writes no further batch of the URL's
   * rows: the ones left are held when a claim reaches one and gets the same answer.
   */
  stop(): Promise<void>;
  readonly relayId: string;
}

/** The outbox's `relay`, for the table `table` (quoted). */
export function createRelay(table: string, relayOptions: RelayOptions): Relay {
  const settings = resolveRelayOptions(table, relayOptions);
  const { sender, batchSize, maxPerUrl, leaseMs, pollMs, relayId, maxAttempts } = settings;
  const claim = createClaim(settings);
  const { record, putBack } = createResults(settings);
  const { disableUrl, holdUrl } = createUrlWrites(settings);

  // A row whose relay died mid-attempt, taken over: that attempt may have reached the endpoint, and
  // the row itself may be what killed the relay (a body that crashes a serialiser, a response that
  // exhausts memory). It is counted as a failed attempt and waits out the same backoff before the
  // next one, instead of being sent again at once after every lease, by every relay in turn.
  // A takeover that dies itself before putting the row back keeps the count its claim took, so even
  // a row that kills relays before they send it moves towards maxAttempts; the claim that finds it
  // there dead-letters it (so does one past the horizon), and no takeover gets here with it.
  const takeOver = (row: Claimed) => putBack(row, sender.nextDelay(Math.max(1, row.attempts - 1)));

  // `heard`: told whether the endpoint answered at all (the loop gives an endpoint that does not
  // one slot until it does, see relay-slots.ts).
  const send = async (
    row: Claimed,
    round: RelayRound,
    clock: () => number,
    more: () => boolean,
    heard?: (answered: boolean) => void,
  ) => {
    // Only a crashed or dead-lettered row's body is null, and neither is sent.
    const attempt = await sender.attempt(
      { url: row.url, id: row.id, body: row.body as Buffer, contentType: row.content_type, headers: row.headers },
      row.attempts,
      { now: clock },
    );
    heard?.(attempt.result !== 'timeout' && attempt.result !== 'network-error');
    const delivered = attempt.result === 'delivered';
    const stop = attempt.result === 'gone' ? 'gone' : !delivered && row.attempts >= maxAttempts ? 'max-attempts' : null;
    const waitMs = delivered || stop ? 0 : sender.nextDelay(row.attempts, attempt.retryAfterMs);
    // Told once recorded, with the wait that follows only when the row waits for another attempt
    // (the database decides the horizon; a failed recording has none). An observer must never break
    // the relay, whether it throws or rejects.
    const tell = (waits: boolean) =>
      notify(relayOptions.onAttempt, { id: row.id, url: row.url }, waits ? { ...attempt, waitMs } : { ...attempt });
    let status: Awaited<ReturnType<typeof record>>;
    try {
      status = await record(row, attempt, delivered, stop, waitMs);
    } catch (error) {
      tell(false);
      throw error;
    }
    tell(status === 'pending');
    // 410 says the endpoint is gone (Standard Webhooks: disable it), not just this event: the
    // other events waiting for the same URL are dead-lettered too instead of each finding out.
    if (stop === 'gone' && status === 'dead') round.dead += await disableUrl(row.url, more);
    // Whatever became of this row (waiting, or dead on its last attempt): the endpoint asked all the
    // same. Not when this claim was fenced off: the claim that took the row over decides.
    else if (
      status !== 'fenced' &&
      !delivered &&
      stop !== 'gone' &&
      (attempt.status === 429 || attempt.retryAfterMs !== undefined)
    )
      round.dead += await holdUrl(row.url, attempt.retryAfterMs, more);
    return status;
  };

  // Whether a hold or a 410's dead-lettering may write one more batch of a URL's rows (it always
  // writes the first): not once three quarters of the round's lease have passed, nor once stop()
  // was called. The round must end within its lease, or runOnce gives it up (relay_round_timeout)
  // and the batches go on in the background, past stop(); the last quarter is left for the batch
  // in flight and the round's other rows to record their results. A shutdown waits for the round's
  // attempts, not for a backlog no attempt is waiting on. The rows left are the URL's latest due
  // (the batches go in due order): the next claim that reaches one sends it, and the answer (one
  // more 429 or 410) writes the next batches.
  const batchesWhile = (signal: AbortSignal | undefined) => {
    const ends = performance.now() + leaseMs * 0.75;
    return () => performance.now() < ends && !signal?.aborted;
  };

  // Attempts are signed (webhook-timestamp) by the database's clock, the one that schedules them,
  // carried forward by this process's monotonic clock: a relay host whose wall clock is minutes
  // off would otherwise send signatures every receiver refuses as too old or too new, and dates
  // in its history that disagree with next_attempt_at.
  const clockOf = (rows: Claimed[]) => {
    const claimedAt = performance.now();
    const databaseNow = rows[0]?.database_now ?? 0;
    return () => databaseNow + (performance.now() - claimedAt);
  };

  // One claimed row to its end: a row dead-lettered by its claim is done already, a crashed one is
  // put back, any other gets its attempt.
  const workOn = (
    row: Claimed,
    round: RelayRound,
    clock: () => number,
    more: () => boolean,
    heard?: (answered: boolean) => void,
  ) =>
    row.status === 'dead'
      ? Promise.resolve('dead' as const)
      : row.crashed
        ? takeOver(row)
        : send(row, round, clock, more, heard);

  const runRound = async (signal: AbortSignal | undefined): Promise<RelayRound> => {
    const more = batchesWhile(signal);
    // Claims until the batch is full or no more rows are due, as the loop does (a claim reads few
    // candidates: a URL at its share is left out of the next one), a few claims at most.
    const rows: { row: Claimed; clock: () => number }[] = [];
    const room = new Map<string, number>();
    for (let claims = 0; claims < 4 && rows.length < batchSize; claims++) {
      const got = await claim(batchSize - rows.length, room);
      const clock = clockOf(got.rows);
      for (const row of got.rows) {
        rows.push({ row, clock });
        if (row.status !== 'dead') room.set(row.url, (room.get(row.url) ?? maxPerUrl) - 1);
      }
      if (!got.moreDue) break;
    }
    const round: RelayRound = { claimed: rows.length, delivered: 0, retrying: 0, dead: 0, fenced: 0 };
    // Settle every row before the round ends, even when one fails: stop() promises the round in
    // flight is over, and a caller may close the pool right after it.
    const settled = await Promise.allSettled(
      rows.map(async ({ row, clock }) => {
        const status = await workOn(row, round, clock, more);
        if (status === 'pending') round.retrying++;
        else round[status]++;
      }),
    );
    const failed = settled.find((result) => result.status === 'rejected');
    if (failed) throw failed.reason;
    return round;
  };

  // Work whose query never returns (a database host gone silent, without a reset) would hold the
  // round, or the loop's slot, and stop(), for ever. Past its lease nothing it does counts (another
  // claim may hold its rows, and the fence refuses its results), so it is given up then and
  // reported; if the query ever returns, the work finishes in the background and its late
  // results are fenced off.
  const withinLease = <T>(work: Promise<T>, message: string, details: Record<string, unknown>): Promise<T> => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new WebhookError('relay_round_timeout', message, { details: { leaseMs, ...details } })),
        leaseMs,
      );
    });
    return Promise.race([work, deadline]).finally(() => clearTimeout(timer));
  };

  let running: Promise<void> | undefined;
  let stopping: AbortController | undefined;

  // The background loop keeps up to batchSize rows in flight, each on its own lease, and claims
  // again as soon as one ends (relay-slots.ts). `signal`: the loop's, which stop() aborts.
  const loop = (signal: AbortSignal) =>
    runSlots<{ url: string; row: Claimed; clock: () => number }>(
      {
        slots: batchSize,
        maxPerUrl,
        pollMs,
        claim: async (limit, room) => {
          const { rows, moreDue } = await withinLease(
            claim(limit, room),
            'The relay did not finish a claim within its lease.',
            {},
          );
          const clock = clockOf(rows);
          return {
            work: rows.filter((row) => row.status !== 'dead').map((row) => ({ url: row.url, row, clock })),
            claimed: rows.length,
            moreDue,
          };
        },
        // The counts of a round are runOnce()'s; the loop's rows are told through onAttempt.
        work: async ({ row, clock }) => {
          let answered: boolean | undefined;
          const round = { claimed: 1, delivered: 0, retrying: 0, dead: 0, fenced: 0 };
          const heard = (value: boolean) => {
            answered = value;
          };
          await withinLease(
            workOn(row, round, clock, batchesWhile(signal), heard),
            'The relay did not finish a row within its lease.',
            { id: row.id },
          );
          return answered;
        },
        // Without the failed statement's values (PGlite's `params`: bodies, partner answers).
        onError: (error) => notify(relayOptions.onError, withoutCommandValues(error)),
      },
      signal,
    );

  return {
    relayId,
    runOnce: () => withinLease(runRound(undefined), 'The relay round did not finish within its lease.', {}),
    start() {
      if (stopping !== undefined && !stopping.signal.aborted) return;
      // A start while a stop() is still waiting for its round is a restart: the new loop begins once
      // the old one has ended, so two loops never run at once, and the stop cannot undo it.
      const controller = new AbortController();
      const previous = running ?? Promise.resolve();
      stopping = controller;
      running = previous.then(() => loop(controller.signal));
    },
    async stop() {
      const stopped = running;
      stopping?.abort();
      await stopped;
      if (running === stopped) running = undefined;
    },
  };
}
