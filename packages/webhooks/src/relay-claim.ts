import type { RelaySettings } from './relay-options.js';
import { horizonEnds, withLost } from './relay-sql.js';

// How far into the due rows a relay's claim reads (`_due`, in due order) before it gives up on the
// head and walks the URLs instead: `headPerWindow` times its window of candidates (twice its limit),
// at least `headRows`. The head covers the rows a claim passes over in the common case (the other
// relays' rows in flight, a backlog of a URL at its share that is not long) so that only a long
// backlog of URLs the claim may not take brings the walk in. Measured: 1,000 rows of a dead URL's
// backlog read past cost 0.43 ms, about what the walk that follows costs (0.9 ms, its planning
// included), so a claim behind any backlog costs at most about twice the cheapest of the two.
const headRows = 1_000;
const headPerWindow = 10;
// The most URLs one walk looks at (URLs at their share stepped over are not counted): its
// window of candidates, at least `minProbes`. About 12 µs each (32: 0.4 ms, 100: 1.2 ms), so a
// claim stays bounded with any number of endpoints; the next claim goes on where it stopped.
const minProbes = 32;

/** A row as a claim returns it. */
export type Claimed = {
  id: string;
  url: string;
  /** Null for a crashed or dead-lettered row: neither is sent. */
  body: Buffer | null;
  content_type: string;
  headers: Record<string, string>;
  /** 'dead' when the claim itself dead-lettered the row; nothing more is written then. */
  status: 'pending' | 'dead';
  /** Counts this claim too, unless the claim dead-lettered the row. A requeue resets it. */
  attempts: number;
  /** The fencing token: every claim raises it, nothing lowers or resets it. */
  claims: number;
  crashed: boolean;
  /** The database's clock when the claim ran, epoch ms. */
  database_now: number;
};

/**
 * The relay's claim: leases up to `limit` due rows, as `room` leaves each URL (see claimSql), and
 * says whether more are due.
 */
export function createClaim(settings: RelaySettings) {
  const { db, table, leaseMs, relayId, horizonParam, maxAttemptsParam, maxPerUrl } = settings;

  // How both claim statements end: `picked` names the rows; each is locked (SKIP LOCKED: another
  // relay's claim may have taken it since it was read) and checked again under the lock, then
  // leased, or dead-lettered by the claim itself.
  // `crashed`: the row's last claim never recorded a result (every write that ends a claim clears
  // locked_by), so its relay died or stalled mid-attempt and its lease ran out. Read before the
  // UPDATE overwrites locked_by.
  // `stop`: the row may not be attempted again, and the claim dead-letters it itself. Either it
  // has used up its attempts (they count every claim, the crashed ones too), or an attempt was
  // made and the horizon has passed since (a first attempt is always made). A due row gets here
  // when its relay died (a takeover that dies before it can put the row back must not leave it to
  // the next takeover, for ever, each adding an attempt past maxAttempts), when the relays fell
  // behind, or when the schedule was shortened since the row was put back.
  // Neither a crashed row (see takeOver) nor a stopped one is sent by this claim, so its body is
  // not loaded: a body that kills the relay that loads it would otherwise kill every takeover too.
  // A crashed row's lost attempt gets its history entry here (withLost), in the statement that
  // takes the row over: so even when this relay dies right after, or the claim dead-letters the
  // row. last_attempt is left alone: it is the last result that came back, and none did.
  // dead_at is when a row was dead-lettered, on every path that does it (this claim, `ending`, a
  // 410's disableUrl, a hold's past the horizon): purge() ages dead rows by it. A claim, and the
  // write that ends it, set it afresh (null on a row they leave alive), so that a row requeued by
  // an earlier version (which knows no dead_at) does not keep the time it first died.
  const leaseSql = `due AS (
              SELECT id, locked_by IS NOT NULL AS crashed,
                     CASE WHEN attempts >= $5::double precision THEN 'max-attempts'
                          WHEN attempts >= 1 AND now() > ${horizonEnds('', '$4')} THEN 'horizon' END AS stop
                FROM ${table}
               WHERE id = ANY(ARRAY(SELECT id FROM picked))
                 AND status = 'pending'
                 AND next_attempt_at <= now()
                 AND (locked_until IS NULL OR locked_until <= now())
                 FOR UPDATE SKIP LOCKED),
              claimed AS (
         UPDATE ${table} AS o
            SET status = CASE WHEN due.stop IS NULL THEN o.status ELSE 'dead' END,
                dead_reason = coalesce(due.stop, o.dead_reason),
                dead_at = CASE WHEN due.stop IS NOT NULL THEN now() END,
                locked_until = CASE WHEN due.stop IS NULL
                                    THEN now() + ($2::double precision * interval '1 millisecond') END,
                locked_by = CASE WHEN due.stop IS NULL THEN $3::text END,
                attempts = o.attempts + CASE WHEN due.stop IS NULL THEN 1 ELSE 0 END,
                claims = o.claims + 1,
                history = ${withLost('o.')}
           FROM due
          WHERE o.id = due.id
        RETURNING o.id, o.url, CASE WHEN due.crashed OR due.stop IS NOT NULL THEN NULL ELSE o.body END AS body,
                  o.content_type, o.headers, o.status, o.attempts, o.claims, due.crashed,
                  floor(extract(epoch FROM now()) * 1000)::float8 AS database_now)`;

  // $6 and $7 of a claim: the URLs with room left and how much; $8: those with none.
  const roomParams = (room: ReadonlyMap<string, number>) => {
    const partly = [...room].filter(([, left]) => left > 0);
    return [
      partly.map(([url]) => url),
      partly.map(([, left]) => left),
      [...room].filter(([, left]) => left <= 0).map(([url]) => url),
    ];
  };

  // Always one row at least: a claim that took nothing still says whether rows were due (a row of
  // nulls and `more_due`), so a relay that lost every row it picked to another relay's claim
  // made at the same moment claims again at once instead of waiting out its poll.
  const claimedOf = (rows: unknown[]) =>
    (rows as (Claimed | { id: null })[]).filter((row): row is Claimed => row.id !== null);

  // How many of one URL's rows a claim may take, as `room` says for each URL this relay already
  // has rows of in flight (none for a URL missing from it): `maxPerUrl` less those. A claim reads
  // the due rows in due order, leaving out the URLs with no room, picks up to the room of each
  // URL among the first `2 × limit` of them, and leases the first `limit` picked. Without
  // a share, a backlog for one endpoint (a dead one that makes every attempt wait the whole
  // timeout, or a slow one) filled every claim, and every other endpoint's events waited behind
  // it. The candidates are read without a lock; the rows picked are locked (SKIP LOCKED) and
  // checked again under the lock, as another relay may have claimed one since.
  // `moreDue`: due rows were left out (for their URL's share, the limit, or another relay's claim
  // that took them first), so a claim made at once may find more (the loop claims again while it
  // has free slots). That is also why the candidates are few: when one URL's backlog fills them,
  // the claim made at once leaves that URL out, now at its share, and reads the rows behind it.
  // A window of `limit × maxPerUrl` rows read 1,250 rows a claim for a batch of 50 (and a claim
  // runs each time slots free): a relay's throughput against an instant endpoint fell by a third.
  // Leaving a URL out is a filter on the rows `_due` gives, so the rows of the URLs left out are
  // read all the same: with a dead endpoint's backlog at the head of the due rows, every claim
  // read that whole backlog before the first row it could take (31 ms a claim behind 200,000 due
  // rows, once per attempt that ends, for as long as the partner is down). So the claim reads a
  // bounded head of `_due` (claimSql, see headRows); only when that head left the claim short,
  // all of it rows left out or leased, does it reach further, through `_url`, one URL after
  // another from where the last such walk stopped (fallbackSql). Not the walk every time: it
  // costs about two index descents per URL with pending rows, far more than the head when there
  // are thousands of endpoints and no URL is left out. And a second statement, sent only then,
  // rather than the walk behind a condition in the first: PostgreSQL plans every part of a
  // statement, run or not, and the one statement took 1.2 ms to plan instead of 0.3 ms, so the
  // common claim took 2.5 ms instead of 1 ms. The head in a subquery, and no ORDER BY outside
  // it: the candidates come in its order, and the scan stops at the $9th (a sort there would read
  // the whole head every time). `capped` costs the common claim 0.05 ms, to plan the EXISTS.
  const claimSql = `WITH room AS (SELECT * FROM unnest($6::text[], $7::int[]) AS r(url, room)),
              candidate AS (
              SELECT id, url, next_attempt_at
                FROM (SELECT id, url, next_attempt_at, locked_until
                        FROM ${table}
                       WHERE status = 'pending'
                         AND next_attempt_at <= now()
                       ORDER BY next_attempt_at
                       LIMIT $10) AS head
               WHERE (locked_until IS NULL OR locked_until <= now())
                 AND url <> ALL($8::text[])
               LIMIT $9),
              picked AS (
              SELECT ranked.id
                FROM (SELECT id, url, next_attempt_at,
                             row_number() OVER (PARTITION BY url ORDER BY next_attempt_at, id) AS n
                        FROM candidate) AS ranked
                LEFT JOIN room ON room.url = ranked.url
               WHERE ranked.n <= coalesce(room.room, $11)
               ORDER BY ranked.next_attempt_at
               LIMIT $1),
              ${leaseSql}
         SELECT claimed.*, (SELECT count(*) FROM candidate) > (SELECT count(*) FROM claimed) AS more_due,
                CASE WHEN (SELECT count(*) FROM candidate) >= $9 THEN false
                     ELSE EXISTS (SELECT FROM ${table} WHERE status = 'pending' AND next_attempt_at <= now()
                                   ORDER BY next_attempt_at OFFSET $10 - 1) END AS capped
           FROM (VALUES (1)) AS one (x) LEFT JOIN claimed ON true`;

  // The rest of a claim whose head was used up (claimSql's `capped`): up to $1 more rows, from
  // the URLs with pending rows in the order of `_url`, starting after $10 (the URL where this
  // relay's last walk stopped) and wrapping round to the first, one URL per step: the next URL
  // (one descent, `min(url) > the last`), then its first due rows up to its room (a descent of
  // the URL's range in due order, past its leased rows). The URLs with no room ($8) are stepped
  // over without a look, so a dead URL's backlog costs one descent, not a read of it. It stops
  // once it has $1 rows, after $9 URLs looked at, or back where it started. Fair: a URL is looked
  // at once per lap, whatever its place in the due order, and the next walk begins after the
  // last URL this one looked at (`walked_to`): a walk bounded by the URLs it may look at does
  // not start from the first URL every time and starve the last ones. `more_due` when it was cut
  // short: URLs not looked at may have rows due.
  const fallbackSql = `WITH RECURSIVE room AS (SELECT * FROM unnest($6::text[], $7::int[]) AS r(url, room)),
              walk (step, url, lap, probes, got, ids) AS (
              -- The start in the url column's collation, as the URLs the walk steps to are: one
              -- given to the column (COLLATE "C") would otherwise differ from the parameter's, which
              -- a recursive query refuses. (No row: the subquery only lends its collation.)
              SELECT 0, coalesce((SELECT url FROM ${table} WHERE false), $10::text), 0, 0, 0::bigint, '{}'::text[]
              UNION ALL
              SELECT w.step + 1, nxt.url, nxt.lap, w.probes + CASE WHEN nxt.skip THEN 0 ELSE 1 END,
                     w.got + cardinality(found.ids), found.ids
                FROM walk AS w
               CROSS JOIN LATERAL (
                     SELECT after.url, after.lap, after.url = ANY($8::text[]) AS skip
                       FROM (SELECT coalesce(next.url, CASE WHEN w.lap = 0
                                                            THEN (SELECT min(url) FROM ${table} WHERE status = 'pending') END) AS url,
                                    CASE WHEN next.url IS NULL THEN 1 ELSE w.lap END AS lap
                               FROM (SELECT min(url) AS url FROM ${table}
                                      WHERE status = 'pending' AND url > w.url) AS next
                             -- Kept a subquery: pulled up, its expression (and its subqueries) would
                             -- be planned once for every place that names it.
                             OFFSET 0) AS after) AS nxt
               CROSS JOIN LATERAL (
                     SELECT CASE WHEN nxt.skip THEN '{}'::text[] ELSE ARRAY(
                              -- A range of one URL in the order of _url, as holdUrl reads (see urlIs).
                              SELECT id FROM ${table}
                               WHERE url >= nxt.url AND url <= nxt.url AND status = 'pending'
                                 AND next_attempt_at <= now()
                                 AND (locked_until IS NULL OR locked_until <= now())
                               ORDER BY url, next_attempt_at
                               LIMIT least(coalesce((SELECT room FROM room WHERE room.url = nxt.url), $11), $1 - w.got))
                            END AS ids) AS found
               WHERE w.probes < $9 AND w.got < $1
                 AND nxt.url IS NOT NULL AND NOT (nxt.lap = 1 AND nxt.url > $10::text)),
              picked AS (SELECT unnest(ids) AS id FROM walk WHERE step > 0),
              ${leaseSql}
         SELECT claimed.*,
                (SELECT count(*) FROM picked) > (SELECT count(*) FROM claimed)
                  OR (SELECT max(probes) >= $9 OR max(got) >= $1 FROM walk) AS more_due,
                (SELECT url FROM walk WHERE step > 0 ORDER BY step DESC LIMIT 1) AS walked_to
           FROM (VALUES (1)) AS one (x) LEFT JOIN claimed ON true`;

  // Where this relay's last walk (fallbackSql) stopped: the next one starts after it.
  let walkedTo = '';
  const claim = async (limit: number, room: ReadonlyMap<string, number> = new Map()) => {
    // A safe integer whatever the batch: pg would send a larger one as 1e+31, which LIMIT refuses.
    const window = Math.min(limit * 2, Number.MAX_SAFE_INTEGER);
    const first = await db.query(claimSql, [
      limit,
      leaseMs,
      relayId,
      horizonParam,
      maxAttemptsParam,
      ...roomParams(room),
      window,
      Math.min(Math.max(headRows, window * headPerWindow), Number.MAX_SAFE_INTEGER),
      // Last, as it always was: the share of a URL with nothing in flight.
      maxPerUrl,
    ]);
    const rows = claimedOf(first.rows);
    const capped = first.rows[0]?.capped === true;
    // Rows past the head were never looked at: due ones may be there.
    const moreDue = first.rows[0]?.more_due === true || capped;
    if (!capped || rows.length >= limit) return { rows, moreDue };
    // The rows just claimed count against their URLs' room, as the caller will count them.
    const left = new Map(room);
    for (const row of rows) if (row.status !== 'dead') left.set(row.url, (left.get(row.url) ?? maxPerUrl) - 1);
    const rest = await db.query(fallbackSql, [
      limit - rows.length,
      leaseMs,
      relayId,
      horizonParam,
      maxAttemptsParam,
      ...roomParams(left),
      Math.min(Math.max(minProbes, window), Number.MAX_SAFE_INTEGER),
      walkedTo,
      maxPerUrl,
    ]);
    const walked = rest.rows[0]?.walked_to;
    if (typeof walked === 'string') walkedTo = walked;
    return {
      rows: [...rows, ...claimedOf(rest.rows)],
      moreDue: first.rows[0]?.more_due === true || rest.rows[0]?.more_due === true,
    };
  };

  return claim;
}
