// An instance of the version before `status_message` (commit 083f687), as the table sees it: the
// statements it sent, captured in fixtures/statements-before-phrase.json (for the table
// "idem_records", under the names it prepared them by), bound to the parameters its store gave
// them. Its JavaScript is not needed: only its SQL meets a table that a later migrate() changed.
import { readFileSync } from 'node:fs';
import type { PostgresClient } from '../src/index.js';
import { createSqlClient } from '../src/sql-client.js';
import type { Statement, Statements } from '../src/statements.js';

/** The earlier version's statements for the table `idem_records`, as it sent them. */
export const statementsBeforePhrase: Statements = JSON.parse(
  readFileSync(new URL('./fixtures/statements-before-phrase.json', import.meta.url), 'utf8'),
);

/** A row the earlier version's claim or get read: no `status_message` among its columns. */
export type EarlierRow = Record<string, unknown>;

/**
 * The earlier version's store operations on `idem_records` (in the client's search_path), each
 * resolving to the rows or the count its statement returned.
 *
 * @example
 * const earlier = earlierInstance(pool);
 * await earlier.claim(id, 't');
 */
export function earlierInstance(client: PostgresClient) {
  const sql = createSqlClient(client);
  const run = (statement: Statement, params: unknown[]) => sql.run<EarlierRow>(statement, params);
  const s = statementsBeforePhrase;
  const completeParams = (id: string, token: string, status: number, body: string) => [
    id,
    token,
    status,
    JSON.stringify({ 'content-type': 'text/plain' }),
    new TextEncoder().encode(body),
    60_000,
  ];
  return {
    claim: async (id: string, token: string) => (await run(s.claim, [id, token, 'fp', 5_000, 0, null])).rows,
    renew: async (id: string, token: string) => (await run(s.renew, [id, token, 5_000])).rowCount,
    complete: async (id: string, token: string, body: string, status = 201) =>
      (await run(s.complete, completeParams(id, token, status, body))).rowCount,
    release: async (id: string, token: string) => (await run(s.release, [id, token])).rowCount,
    forget: async (id: string, token: string) => (await run(s.forget, [id, token])).rowCount,
    get: async (id: string) => (await run(s.get, [id])).rows[0],
    purge: async () => (await run(s.purge, [1000, 60 * 60 * 1000])).rowCount,
    // Its transactional mode: the handler's work, then the completion, in one transaction.
    completeInTransaction: (id: string, token: string, body: string) =>
      sql.transaction(async (tx) => {
        const { rowCount } = await tx.query(s.completeInTransaction.text, completeParams(id, token, 201, body));
        return { commit: rowCount > 0, value: rowCount };
      }),
  };
}
