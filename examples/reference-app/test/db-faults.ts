// What the tests of a failing database share: the fault itself, a switch for it, and the databases
// it runs on.
import type { Database } from '../src/db.js';

/**
 * A statement the database itself refuses, as it does on a connection the server ends (57P01): sent
 * in place of a statement a test makes fail, on PGlite and PostgreSQL alike.
 */
export const terminated = `do $$ begin raise exception 'terminating connection due to administrator command'
  using errcode = '57P01'; end $$`;

/**
 * The databases such a test runs on, for `describe.each`: the embedded PGlite always, PostgreSQL when
 * `DATABASE_URL` names one. Each entry is its name and whether it is the embedded one.
 */
export const databases: Array<[string, boolean]> = [['the embedded PGlite', true]];
if (process.env.DATABASE_URL) databases.push(['PostgreSQL', false]);

/** The statement that stores a refresh's tokens and ends its claim (sessions.ts, `finishRefresh`). */
export const storesRefresh = (text: string) =>
  text.trimStart().startsWith('update app_sessions set data') && text.includes('refreshing_by = $5');

/** `db`, whose every store of a refresh's tokens is the database's refusal (57P01) while `failing()`. */
export const failingRefreshStores = (db: Database, failing: () => boolean): Database => ({
  ...db,
  query: <Row>(text: string, params: readonly unknown[] = []) =>
    failing() && storesRefresh(text) ? db.query<Row>(terminated) : db.query<Row>(text, params),
});

/** Whether a statement (its text and parameters) is one that fails. */
type Which = (text: string, params: readonly unknown[]) => boolean;

/**
 * A switch over every statement of a database: `wrap` it where a stack takes a database (`wrapDb`,
 * `wrapIdpDb`), then `during('down', request)` makes each statement the database's own refusal
 * (57P01) while `request` runs, and `during('bug', request)` a TypeError, as a bug of the app throws.
 * A third argument `which` picks the statements that fail (the others go through): asked before each
 * statement, in order, so it may also note one that goes through ("from the one after this on").
 *
 * @example
 * ```ts
 * const faults = dbFaults();
 * const stack = await startTestStack('x', { wrapDb: faults.wrap });
 * const answer = await faults.during('down', () => fetch(url));
 * ```
 */
export function dbFaults() {
  let fault: 'none' | 'down' | 'bug' = 'none';
  let fails: Which = () => true;
  return {
    wrap: (db: Database): Database => ({
      ...db,
      query: <Row>(text: string, params: readonly unknown[] = []) => {
        if (fault !== 'none' && fails(text, params)) {
          if (fault === 'down') return db.query<Row>(terminated);
          return Promise.reject(new TypeError('Cannot read properties of undefined'));
        }
        return db.query<Row>(text, params);
      },
    }),
    async during<T>(kind: 'down' | 'bug', request: () => Promise<T>, which: Which = () => true): Promise<T> {
      fault = kind;
      fails = which;
      try {
        return await request();
      } finally {
        fault = 'none';
        fails = () => true;
      }
    },
  };
}
