import { retryWithPauses } from '@idem/core';
import type { OutboxRow } from './outbox-row.js';
import type { Claimed } from './relay-claim.js';
import type { RelaySettings } from './relay-options.js';
import { appended, horizonEnds } from './relay-sql.js';
import type { AttemptRecord } from './sender.js';

// jsonb cannot hold U+0000, and a response snippet may contain it (a binary acknowledgement): left
// as is, recording the attempt fails, the row stays leased, and the event is sent again after every
// lease, for ever. The stored text says where the NUL was.
const withoutNul = (_key: string, value: unknown) =>
  typeof value === 'string' ? value.replaceAll('\u0000', '\ufffd') : value;

/**
 * The writes that end a relay's claim: `record` an attempt's result, or `putBack` a row that got no
 * attempt. Each resolves to the row's status, or 'fenced' if another claim took the row over.
 */
export function createResults(settings: RelaySettings) {
  const { db, table, relayId, leaseMs, horizonParam } = settings;

  // Every write that ends a claim is fenced by locked_by, `claims` and the attempt count: if this
  // relay's lease ran out and another claim took the row over (by another relay, or by one that
  // shares this relayId), the newer claim's outcome stands and this late one changes nothing.
  // `claims` is what makes the fence hold across a requeue, which resets `attempts` (so the same
  // relayId could claim the same count again). `attempts` stays in the fence for a relay of an
  // earlier version, which raises only `attempts`, taking over during a rolling upgrade.
  const fence = 'id = $1 AND locked_by = $2 AND claims = $3 AND attempts = $4';
  const fenceValues = (row: Claimed) => [row.id, relayId, row.claims, row.attempts];
  const statusOf = (rows: { status: OutboxRow['status'] }[]) => rows[0]?.status ?? 'fenced';

  // A write that ends a claim, tried again when it fails. Without it a result whose write met a
  // connection the pool had not yet seen die (a database restart, pg_terminate_backend, a pooler
  // recycling its servers) was lost, and the row was sent again once its lease ended: a second
  // delivery for an attempt that worked. Any error is retried: the fence makes a write that did
  // land the first time (its answer lost) change nothing the second time. That second time matches
  // no row, which would read as 'fenced' ("another claim took the row over") in the round's counts
  // and tell onAttempt that no attempt follows; so after a failed try, a write that matches nothing
  // reads back what the row holds if this claim is still its last one and has ended (locked_by
  // cleared with `claims` unchanged: only a write of this claim does that). The budget stays well
  // inside the lease, past which the fence refuses the write anyway.
  const endClaimBudgetMs = Math.min(1_000, leaseMs / 4);
  const endClaim = async (sql: string, values: unknown[]): Promise<{ rows: { status: OutboxRow['status'] }[] }> => {
    let failed = false;
    const result = await retryWithPauses(
      () =>
        db.query(sql, values).catch((error: unknown) => {
          failed = true;
          throw error;
        }),
      { retryable: () => true, budgetMs: endClaimBudgetMs },
    );
    if (!failed || result.rows.length > 0) return result as { rows: { status: OutboxRow['status'] }[] };
    const landed = await retryWithPauses(
      () =>
        db.query(`SELECT status FROM ${table} WHERE id = $1 AND claims = $2 AND locked_by IS NULL`, [
          values[0],
          values[2],
        ]),
      { retryable: () => true, budgetMs: endClaimBudgetMs },
    );
    return landed as { rows: { status: OutboxRow['status'] }[] };
  };

  // How a claim ends, in every query that ends one: the fence in $1 to $4, the wait before the next
  // attempt in $5, the horizon in $6. The first of `first` (a condition, a status, a dead_reason)
  // that holds decides; else the row is dead-lettered with 'horizon' if the wait would end past
  // the horizon, and put back to wait otherwise.
  const ending = (...first: [when: string, status: string, reason: string][]) => {
    const next = `now() + ($5::double precision * interval '1 millisecond')`;
    const branches = [...first, [`${next} > ${horizonEnds('', '$6')}`, "'dead'", "'horizon'"] as const];
    const choose = (column: 1 | 2, otherwise: string) =>
      `CASE ${branches.map((branch) => `WHEN ${branch[0]} THEN ${branch[column]}`).join(' ')} ELSE ${otherwise} END`;
    const status = choose(1, "'pending'");
    return {
      set: `status = ${status}, dead_reason = ${choose(2, 'NULL')}, dead_at = CASE WHEN ${status} = 'dead' THEN now() END,
              next_attempt_at = ${next}`,
      status,
    };
  };
  const endingValues = (row: Claimed, waitMs: number) => [...fenceValues(row), waitMs, horizonParam];

  // $7: delivered, $8: why the attempt ends the retries (410, the last attempt), $9: the attempt,
  // with the wait before the next one. The horizon is decided here, so a row it dead-letters keeps
  // its attempt without that wait: no attempt follows.
  const recordEnding = ending(['$7::boolean', "'delivered'", 'NULL'], ['$8::text IS NOT NULL', "'dead'", '$8::text']);
  const recorded = `CASE WHEN ${recordEnding.status} = 'pending' THEN $9::jsonb ELSE $9::jsonb - 'waitMs' END`;
  const recordSql = `UPDATE ${table}
            SET ${recordEnding.set},
                delivered_at = CASE WHEN $7::boolean THEN now() END,
                locked_until = NULL,
                locked_by = NULL,
                last_attempt = ${recorded},
                history = ${appended('history', recorded)}
          WHERE ${fence}
        RETURNING status`;
  const record = async (
    row: Claimed,
    attempt: AttemptRecord,
    delivered: boolean,
    stop: string | null,
    waitMs: number,
  ) => {
    // With its wait: the statement drops it from a row that ends (delivered, stopped, past the horizon).
    const { rows } = await endClaim(recordSql, [
      ...endingValues(row, waitMs),
      delivered,
      stop,
      JSON.stringify({ ...attempt, waitMs }, withoutNul),
    ]);
    return statusOf(rows);
  };

  // Ends a claim that makes no attempt: it gives back the attempt it counted. The row is put back
  // to wait `waitMs`, or dead-lettered with 'horizon' if the wait would end past it.
  const putBackSql = `UPDATE ${table}
            SET ${ending().set},
                attempts = attempts - 1,
                locked_until = NULL,
                locked_by = NULL
          WHERE ${fence}
        RETURNING status`;
  const putBack = async (row: Claimed, waitMs: number) =>
    statusOf((await endClaim(putBackSql, endingValues(row, waitMs))).rows);

  return { record, putBack };
}
