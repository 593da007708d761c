import { notify, withoutCommandValues } from '@idem/core';
import type { RelaySettings } from './relay-options.js';
import { horizonEnds, withLost } from './relay-sql.js';

/**
 * The relay's writes to all of one URL's waiting rows: `disableUrl` dead-letters them (a 410),
 * `holdUrl` puts them off (a 429, a Retry-After). Each resolves to how many rows it dead-lettered.
 */
export function createUrlWrites(settings: RelaySettings) {
  const { db, table, sender, horizonParam, relayOptions } = settings;

  // holdUrl and disableUrl write one URL's waiting rows in batches of at most `urlBatchSize`, each
  // its own statement (its own short transaction on a pool), until a batch writes fewer. One
  // statement for the whole backlog held every row's lock until it ended: 8.7 s and 90,000 locks
  // for 90,000 rows, the other relays' claims (walking past the locked rows at the head of the
  // due index) 1,000 times slower meanwhile, and a larger backlog outlasted the round's lease.
  // A batch picks its rows through the `_url` index in due order (the rows the next claims would
  // reach first go first), locks them with SKIP LOCKED (a row another statement holds is left to
  // it: a claim leases it, another hold or 410 writes it), and the UPDATE finds them by primary
  // key, re-checking status and lease under the lock (as purge's batches do, for the same
  // reasons). A claim between two batches may send a row not yet written: one more 429 or 410,
  // answered the same way.
  // The URL is matched as a range of one value (`urlIs`), in the order of the `_url` index, not
  // with `url = $1` in due order: for an equality PostgreSQL drops the URL from the order, and
  // then may walk `_due` instead, reading every other URL's pending row due before this URL's
  // (measured: 50,000 of them, 9 ms, for each batch of a URL whose rows were due last). Only
  // `_url` gives (url, next_attempt_at) order, so each batch reads its own rows and no others.
  const urlBatchSize = 1_000;
  const urlIs = `url >= $1 AND url <= $1`;
  const urlOrder = 'ORDER BY url, next_attempt_at';

  // A row whose relay died and that no claim has taken over yet is taken over here: its lost
  // attempt gets its entry, as in a claim. Each batch makes its rows dead, which takes them out of
  // the next batch's selection, so the loop ends once the URL has no waiting row left to take.
  const disableSql = `UPDATE ${table}
            SET status = 'dead', dead_reason = 'gone', locked_until = NULL, locked_by = NULL, dead_at = now(),
                history = ${withLost('')}
          WHERE id = ANY(ARRAY(
                  SELECT id FROM ${table}
                   WHERE ${urlIs} AND status = 'pending' AND (locked_until IS NULL OR locked_until <= now())
                   ${urlOrder}
                   LIMIT $2
                     FOR UPDATE SKIP LOCKED))
            AND status = 'pending' AND (locked_until IS NULL OR locked_until <= now())`;
  // Like a hold, it only spares the others an attempt each: one that fails is reported, never the
  // answered row's failure (its result is recorded), and the batches written before it count.
  const disableUrl = async (url: string, more: () => boolean) => {
    let dead = 0;
    try {
      for (;;) {
        const { rowCount } = await db.query(disableSql, [url, urlBatchSize]);
        dead += rowCount ?? 0;
        if ((rowCount ?? 0) < urlBatchSize || !more()) return dead;
      }
    } catch (error) {
      notify(relayOptions.onError, withoutCommandValues(error));
      return dead;
    }
  };

  // An endpoint that answered 429, or any status with a Retry-After (a 503 during maintenance), spoke
  // for itself, not for the one event: its other waiting events wait as if each had been answered
  // the same on a first attempt (the Retry-After, up to maxRetryAfter, or a first retry's backoff),
  // so a backlog does not keep knocking at the rate the endpoint asked to leave. Not the answered
  // row's own wait: deep in its retries that is its backoff, up to the cap, far longer than the
  // endpoint asked. None counts an attempt, none is moved earlier, and leased rows (in flight with
  // another claim) are left to it. A row already attempted whose horizon ends before the hold does
  // is dead-lettered now, as its own wait past the horizon would have it ('horizon'), with the lost
  // attempt of a crashed claim recorded as a takeover would (withLost). Returns how many it
  // dead-lettered; a hold that fails only lets the others be tried sooner: reported, never the row's
  // failure (the batches written before it stay written, and their dead-lettered rows count).
  // A row already put off to within `slack` of this hold is left as it is. The rows of one round
  // are answered a few milliseconds apart, and each answer's hold ends that much later: without
  // the slack every hold of the round rewrote every waiting row of the URL again (a round of 10
  // answers wrote 450,000 row versions for 90,000 waiting rows, and held their locks for 36 s).
  // A second is Retry-After's own precision; a tenth of a shorter hold keeps a short one short.
  // The hold ends at one time for all its batches: the first batch reckons it from the database's
  // clock (`now()` plus the hold, in $2) and the others are given it (epoch microseconds, as text:
  // exact, whatever the driver makes of a bigint or the session of a date, in $2). Reckoned
  // again by each batch, it would end later with every batch, and once the batches had taken
  // longer than the slack, the rows the first ones held would fall short of it and be picked (and
  // rewritten) again, batch after batch, and the loop would end only by its time budget. At one
  // end, a row a batch held is past the selection's bound: each batch takes rows no batch took,
  // or is the last.
  const holdSql = (until: string) => {
    const pastHorizon = `(attempts >= 1 AND ${until} > ${horizonEnds('', '$3')})`;
    return `UPDATE ${table}
              SET status = CASE WHEN ${pastHorizon} THEN 'dead' ELSE status END,
                  dead_reason = CASE WHEN ${pastHorizon} THEN 'horizon' ELSE dead_reason END,
                  dead_at = CASE WHEN ${pastHorizon} THEN now() ELSE dead_at END,
                  history = CASE WHEN ${pastHorizon} THEN ${withLost('')} ELSE history END,
                  locked_until = CASE WHEN ${pastHorizon} THEN NULL ELSE locked_until END,
                  locked_by = CASE WHEN ${pastHorizon} THEN NULL ELSE locked_by END,
                  next_attempt_at = ${until}
            WHERE id = ANY(ARRAY(
                    SELECT id FROM ${table}
                     WHERE ${urlIs} AND status = 'pending'
                       AND next_attempt_at < ${until} - ($4::double precision * interval '1 millisecond')
                       AND (locked_until IS NULL OR locked_until <= now())
                     ${urlOrder}
                     LIMIT $5
                       FOR UPDATE SKIP LOCKED))
              AND status = 'pending' AND (locked_until IS NULL OR locked_until <= now())
        RETURNING status, (extract(epoch FROM next_attempt_at) * 1000000)::bigint::text AS until_us`;
  };
  const holdFirstSql = holdSql(`now() + ($2::double precision * interval '1 millisecond')`);
  const holdNextSql = holdSql(`('epoch'::timestamptz + $2::bigint * interval '1 microsecond')`);
  const holdUrl = async (url: string, retryAfterMs: number | undefined, more: () => boolean): Promise<number> => {
    const holdMs = sender.nextDelay(1, retryAfterMs);
    const slackMs = Math.min(1_000, holdMs / 10);
    let dead = 0;
    let untilUs: string | undefined;
    try {
      for (;;) {
        const { rows } = await db.query(untilUs === undefined ? holdFirstSql : holdNextSql, [
          url,
          untilUs ?? holdMs,
          horizonParam,
          slackMs,
          urlBatchSize,
        ]);
        const written = rows as { status: string; until_us: string }[];
        dead += written.filter((row) => row.status === 'dead').length;
        if (written.length < urlBatchSize || !more()) return dead;
        untilUs ??= (written[0] as { until_us: string }).until_us;
      }
    } catch (error) {
      notify(relayOptions.onError, withoutCommandValues(error));
      return dead;
    }
  };

  return { disableUrl, holdUrl };
}
