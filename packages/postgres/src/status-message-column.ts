import type { SqlClient } from './sql-client.js';
import { namedStatement } from './statements.js';
import type { TableName } from './table-name.js';

// A rolling deploy may start this version before anyone has run its migrate(): the table then
// lacks `status_message`, and statements that name it would fail every claim, completion and replay
// (42703) until someone migrates. So the store asks the catalog once whether the column is there,
// and without it runs the earlier versions' statements, which keep no reason phrase. Once the
// column is found it is never asked again (the steady state costs nothing); while it is missing it
// is asked again at most once per `recheckMs`, so instances already running start keeping phrases
// soon after migrate() adds it, without a restart.
const recheckMs = 30_000;

// A column of that name counts only with a type the store can write any phrase into, the types
// migrate() accepts for it: text, or varchar without a length. Another one (integer, jsonb, added by
// hand or by another tool) would fail every claim (its UNION meets text with that type, 42804) and
// every completion; varchar(n) each phrase longer than n. Such a table is served as if it had no
// column, without the phrase, and migrate() refuses it with a message that names the column. A
// column whose type is changed under a running store that had found it usable is the same: the
// first statement that fails for it (postgres-store.ts) calls missing(), and the next question, 30 s
// on, finds it unusable by its type, until it is text again.
const text = `SELECT to_regclass($1) IS NOT NULL AS has_table,
       EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass($1) AND attname = 'status_message' AND NOT attisdropped
                 AND (atttypid = 'text'::regtype OR (atttypid = 'varchar'::regtype AND atttypmod = -1))) AS present`;

/**
 * Whether the store's table has a usable `status_message` column, learned from the catalog and
 * cached per store (see above). `present(operation)` resolves to the answer to use now (a failure to
 * ask is reported under `operation`, the store call that needed it); `missing()` records that a
 * statement found the column gone (42703) or of another type (42804, 22001), so the next
 * calls run without it and ask again after `recheckMs`. `tag` is
 * the store's, which its statements' names carry; `now` the store's clock in milliseconds, which
 * only has to move forward (monotonic, not the wall clock: see postgres-store.ts).
 *
 * @example
 * const column = statusMessageColumn(sql, parseTableName('idem_records'), tag, () => performance.now());
 * const statements = (await column.present('claim')) ? withPhrase : withoutPhrase;
 */
export function statusMessageColumn(
  sql: Pick<SqlClient, 'run'>,
  table: TableName,
  tag: string,
  now: () => number,
): { present(operation: string): Promise<boolean>; missing(): void } {
  let known: boolean | undefined;
  let checkedAt = 0;
  // Concurrent first calls share one catalog read.
  let asking: Promise<boolean> | undefined;

  // Named as the store's statements are (statements.ts): by its tag and the text.
  const statement = namedStatement('phrase_column', tag, text);
  // Read with the store's own parsers (sql.run), in a statement of its own: never inside a handler's
  // transaction, where a failure would abort the handler's work. No table at all decides nothing
  // either: every statement fails until migrate() makes it, with the column.
  const ask = async (operation: string): Promise<boolean | undefined> => {
    const { rows } = await sql.run<{ has_table: boolean; present: boolean }>({ ...statement, operation }, [table.sql]);
    return rows[0]?.has_table === true ? rows[0].present === true : undefined;
  };

  return {
    present(operation) {
      if (known === true) return Promise.resolve(true);
      if (known === false && now() - checkedAt < recheckMs) return Promise.resolve(false);
      asking ??= ask(operation).then(
        (answer) => {
          known = answer;
          checkedAt = now();
          asking = undefined;
          return answer === true;
        },
        // A failed read (the database is down) decides nothing: the statement that follows would
        // fail the same way, and the next call asks again.
        (error: unknown) => {
          asking = undefined;
          throw error;
        },
      );
      return asking;
    },
    missing() {
      known = false;
      checkedAt = now();
    },
  };
}
