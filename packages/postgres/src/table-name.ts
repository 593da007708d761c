/**
 * The table name used when none is given, in `schema.sql` and by `postgresStore()`.
 *
 * @example
 * await pool.query(`SELECT count(*) FROM ${defaultTable}`);
 */
export const defaultTable = 'idem_records';

// Plain, unquoted identifiers only: they are spliced into SQL text (a table name cannot be a bind
// parameter), so anything that could need escaping is refused instead of escaped.
const identifier = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

/** A validated table name: the form as given and the quoted form for SQL text. */
export interface TableName {
  /** `schema.table` or `table`, as given. */
  readonly name: string;
  /** Each part double-quoted, ready to splice into SQL. */
  readonly sql: string;
  /** The bare table part, used to name the table's index. */
  readonly base: string;
}

/**
 * Validates a table name (`table` or `schema.table`, letters, digits and `_`) and quotes it.
 * Throws a `TypeError` for anything else: names are spliced into SQL, so they are never escaped,
 * only accepted or refused.
 *
 * @example
 * parseTableName('app.idem_records').sql; // '"app"."idem_records"'
 */
export function parseTableName(table: unknown = defaultTable): TableName {
  if (typeof table !== 'string')
    throw new TypeError('table must be a string such as "idem_records" or "app.idem_records"');
  const parts = table.split('.');
  if (parts.length > 2 || !parts.every((part) => identifier.test(part))) {
    throw new TypeError(
      'table must be "name" or "schema.name" made of letters, digits and "_" (at most 63 characters each)',
    );
  }
  return { name: table, sql: parts.map((part) => `"${part}"`).join('.'), base: parts[parts.length - 1] as string };
}
