// What the tests of a failing database share: the fault itself, and the databases it runs on.

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
