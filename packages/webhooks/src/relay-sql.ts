// SQL pieces that several of the relay's statements share.

// The most attempts a row's `history` keeps: the first `historyHead` (how the failures began) and
// the latest ones. `attempts` still counts them all. Without a bound, a long horizon (a schedule
// that retries for months) grows a row by up to a KiB of response per attempt, and every attempt
// rewrites the whole history.
const maxHistory = 100;
const historyHead = 10;

// SQL for `history` with `entry` (a jsonb object) appended, at the cap keeping the head and the
// latest entries. Not just the one oldest entry after the head dropped per append: a row written
// before the cap existed can hold thousands, and dropping one per append would keep it that long
// (and rewrite all of it on every attempt) for as long as the row lives.
export const appended = (history: string, entry: string) =>
  `CASE WHEN jsonb_array_length(${history}) >= ${maxHistory}
        THEN (SELECT jsonb_agg(kept.item ORDER BY kept.n) FROM jsonb_array_elements(${history}) WITH ORDINALITY AS kept(item, n)
               WHERE kept.n <= ${historyHead} OR kept.n > jsonb_array_length(${history}) - ${maxHistory - historyHead - 1})
             || jsonb_build_array(${entry})
        ELSE ${history} || jsonb_build_array(${entry}) END`;

// The horizon counts from the event's creation, or from its last requeue (which gave it a fresh
// one): the later of the two. `greatest` skips a NULL requeued_at (never requeued). During a
// rolling upgrade, a requeue by the previous version moves created_at to now() and leaves an
// older requeued_at behind: the later one is still the right start.
export const horizonEnds = (alias: string, param: string) =>
  `greatest(${alias}requeued_at, ${alias}created_at) + (${param}::double precision * interval '1 millisecond')`;

// `history` with a LostAttempt appended if the row's last claim never recorded a result (every
// write that ends a claim clears locked_by), from the columns that claim left: SET reads the row
// as it was. Only for a statement that takes over a row whose lease is over (its WHERE says so)
// and overwrites locked_by, so that each lost claim gets one entry, under the row lock.
export const withLost = (alias: string) =>
  `CASE WHEN ${alias}locked_by IS NULL THEN ${alias}history
            ELSE ${appended(
              `${alias}history`,
              `jsonb_build_object(
                   'attempt', ${alias}attempts, 'result', 'lost'::text, 'claim', ${alias}claims,
                   'relayId', ${alias}locked_by,
                   'leaseEndedAt', floor(extract(epoch FROM ${alias}locked_until) * 1000)::bigint,
                   'takenOverAt', floor(extract(epoch FROM now()) * 1000)::bigint)`,
            )} END`;
