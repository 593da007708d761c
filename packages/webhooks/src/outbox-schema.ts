import { createHash } from 'node:crypto';
import { assertKnownOptions, type Duration, type ListsEvery, retryWithPauses, toMilliseconds } from '@idem/core';
import type { Queryable } from './queryable.js';

/** Options of {@link Outbox.migrate}. */
export interface OutboxMigrateOptions {
  /**
   * How long one try of a change to a table that exists (adding a column, building a missing index)
   * waits for the table's lock. Such a change waits for every transaction open on the table (one
   * that called `add()` and is still running), and every relay claim and `add()` queues behind it
   * while it waits: a try that waits longer gives up, frees the queue, and is tried again after a
   * pause. Default `'500ms'`; `false` waits as long as it takes (or as your session's own
   * `lock_timeout` says). It does not bound the build of an index once it has its lock.
   */
  lockTimeout?: Duration | false | undefined;
  /** How long migrate() keeps trying before it rejects with the last `55P03` error. Default `'30s'`. */
  lockWait?: Duration | undefined;
}

const migrateOptionNames = ['lockTimeout', 'lockWait'] as const satisfies readonly (keyof OutboxMigrateOptions)[];
const migrateOptionNamesAll: ListsEvery<OutboxMigrateOptions, typeof migrateOptionNames> = true;
void migrateOptionNamesAll;

const IDENT = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

export function quoteTable(name: string): { sql: string; base: string } {
  const parts = name.split('.');
  if (parts.length > 2 || !parts.every((part) => IDENT.test(part))) {
    throw new TypeError('table must be an identifier (letters, digits, _), optionally schema-qualified');
  }
  return { sql: parts.map((part) => `"${part}"`).join('.'), base: parts.at(-1) as string };
}

/**
 * The name of one of the table's indexes: `<table><suffix>` (`_due`, `_url`, `_delivered`, `_dead`).
 * PostgreSQL cuts identifiers to 63 bytes, so that name for a long table name would be cut to a name
 * another relation may have (the table itself, for 63 characters, or a sibling index), and CREATE
 * INDEX IF NOT EXISTS would skip it in silence, leaving every claim (or purge) to scan the table. A
 * name that does not fit keeps the table's first characters and a hash of the whole name, as the
 * PostgreSQL store names its own index. Table names are ASCII (see IDENT): characters are bytes.
 */
function indexName(base: string, suffix: string): string {
  const plain = `${base}${suffix}`;
  if (plain.length <= 63) return plain;
  const hash = createHash('sha256').update(base).digest('hex').slice(0, 8);
  return `${base.slice(0, 63 - suffix.length - hash.length - 1)}_${hash}${suffix}`;
}

// The indexes migrate() makes besides the primary key: the relay's due rows, one URL's waiting rows,
// and the three that keep each purge() batch (and each deadLetters() page, in its order) an index
// scan. A table that has millions of delivered rows would otherwise be read whole by every batch.
// Dead rows have two: deadLetters() lists them in the order they happened (`_dead`, created_at),
// which a requeue keeps, and purge() deletes them in the order they died (`_dead_at`). One index
// for both would leave one of them reading every dead row: a row that retried for a year and died
// yesterday is first in created_at order and last in dead_at order. `_dead_at` leads with dead_at,
// and a btree keeps the NULLs (rows dead before dead_at existed) together at its end, ordered by
// next_attempt_at, which their purge batch ages them by (see purgeSql).
// `_url` serves holdUrl (a 429 or a Retry-After) and disableUrl (a 410): without it each read every
// pending row through `_due` and kept one URL's, so a partner answering 429 cost as much as the whole
// backlog of every partner (100,000 pending rows read to hold 1,429).
const indexes = [
  { suffix: '_due', columns: ['next_attempt_at'], status: 'pending' },
  { suffix: '_url', columns: ['url', 'next_attempt_at'], status: 'pending' },
  { suffix: '_delivered', columns: ['delivered_at'], status: 'delivered' },
  { suffix: '_dead', columns: ['created_at', 'id'], status: 'dead' },
  { suffix: '_dead_at', columns: ['dead_at', 'next_attempt_at'], status: 'dead' },
] as const;

/** The outbox's `migrate`, for the table `table` (quoted) whose unqualified name is `base`. */
export function createMigrate(table: string, base: string) {
  // A DO block's IF that creates `index` when the catalog has neither its name nor an index doing
  // its work (see migrate). `outbox` and `schema_name` are the block's variables.
  const createIndexIfMissing = (index: (typeof indexes)[number]) => {
    const indexed = indexName(base, index.suffix);
    return `
        IF to_regclass(format('%I.%I', schema_name, '${indexed}')) IS NULL
           AND NOT EXISTS (
             SELECT 1 FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am m ON m.oid = i.relam
              WHERE x.indrelid = outbox AND x.indisvalid AND m.amname = 'btree' AND x.indexprs IS NULL
                AND x.indkey[0] = (SELECT attnum FROM pg_attribute
                                    WHERE attrelid = outbox AND attname = '${index.columns[0]}' AND NOT attisdropped)
                AND pg_get_expr(x.indpred, x.indrelid) = '(status = ''${index.status}''::text)')
        THEN
          CREATE INDEX IF NOT EXISTS "${indexed}" ON ${table} (${index.columns.join(', ')}) WHERE status = '${index.status}';
        END IF;`;
  };

  const migrate = async (db: Queryable, migrateOptions: OutboxMigrateOptions = {}) => {
    if (!db || typeof db.query !== 'function') throw new TypeError('migrate needs db (a pg Pool or client)');
    if (!migrateOptions || typeof migrateOptions !== 'object') throw new TypeError('migrate takes an options object');
    assertKnownOptions(migrateOptions, new Set(migrateOptionNames), 'migrate');
    const lockTimeoutMs =
      migrateOptions.lockTimeout === false
        ? undefined
        : toMilliseconds(migrateOptions.lockTimeout ?? '500ms', 'lockTimeout');
    const lockWaitMs = toMilliseconds(migrateOptions.lockWait ?? '30s', 'lockWait');
    // lock_timeout (55P03): the implicit transaction rolled back, nothing changed; the queue that
    // formed behind the waiting DDL is free again until the next try.
    await retryWithPauses(() => migrateOnce(db, lockTimeoutMs), {
      retryable: (error) => lockTimeoutMs !== undefined && (error as { code?: unknown })?.code === '55P03',
      budgetMs: lockWaitMs,
    });
  };

  const migrateOnce = async (db: Queryable, lockTimeoutMs: number | undefined) => {
    // One simple-protocol query runs as one implicit transaction; the advisory lock makes concurrent
    // migrations (several processes booting at once) wait instead of racing on the catalog. One lock
    // for every outbox: a table named two ways (`t` and `public.t`) must not get two.
    // Once the table is up to date, nothing here may wait on a lock a writer holds: a migrate() that
    // queues for one (behind a transaction that called add() and is still open) makes every relay
    // claim and every add() queue behind it. CREATE TABLE IF NOT EXISTS takes no lock on a table that
    // exists, but ALTER TABLE and CREATE INDEX IF NOT EXISTS lock the table before they look whether
    // there is anything to do, so each runs only when the catalog says it is needed, and so does
    // CREATE TABLE (even with IF NOT EXISTS it needs CREATE on the schema, which a role that may only
    // read and write the table lacks):
    // - a table made by an earlier version lacks `claims`, `requeued_at` or `dead_at`. Each is cheap
    //   to add: no default (`requeued_at`, `dead_at`) or a constant one (`claims`) rewrites no row;
    // - each index is looked up in the table's own schema (where CREATE INDEX puts it), whether the
    //   table was named with its schema or found on the search_path. An index that does the same work
    //   under another name (the `(created_at, id) WHERE status = 'dead'` the docs once told users to
    //   make for deadLetters()) counts too: a valid b-tree on the same leading column with the same
    //   predicate, which PostgreSQL writes back the same way however it was typed. Building a second
    //   one would block every add() for as long as the build takes, to no end. A name taken by
    //   something else is left alone (CREATE INDEX IF NOT EXISTS would lock the table, then skip).
    await db.query(`
      SELECT pg_advisory_xact_lock(hashtext('idem_webhook_outbox'));
      DO $$
      BEGIN
        IF to_regclass('${table}') IS NULL THEN
          CREATE TABLE ${table} (
            id text PRIMARY KEY,
            url text NOT NULL,
            body bytea NOT NULL,
            content_type text NOT NULL DEFAULT 'application/json',
            headers jsonb NOT NULL DEFAULT '{}'::jsonb,
            status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
            attempts integer NOT NULL DEFAULT 0,
            claims integer NOT NULL DEFAULT 0,
            created_at timestamptz NOT NULL DEFAULT now(),
            requeued_at timestamptz,
            next_attempt_at timestamptz NOT NULL DEFAULT now(),
            locked_until timestamptz,
            locked_by text,
            delivered_at timestamptz,
            dead_reason text,
            dead_at timestamptz,
            last_attempt jsonb,
            history jsonb NOT NULL DEFAULT '[]'::jsonb
          );
        END IF;
      END $$;
      DO $$
      DECLARE
        outbox regclass := '${table}'::regclass;
        schema_name name := (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                              WHERE c.oid = outbox);
      BEGIN
        -- Each change below waits at most this long for its lock (see OutboxMigrateOptions).
        ${lockTimeoutMs === undefined ? '' : `PERFORM set_config('lock_timeout', '${Math.max(1, Math.round(lockTimeoutMs))}ms', true);`}
        IF (SELECT count(*) FROM pg_attribute
             WHERE attrelid = outbox AND attname IN ('claims', 'requeued_at', 'dead_at') AND NOT attisdropped) < 3
        THEN
          ALTER TABLE ${table} ADD COLUMN IF NOT EXISTS claims integer NOT NULL DEFAULT 0,
                               ADD COLUMN IF NOT EXISTS requeued_at timestamptz,
                               ADD COLUMN IF NOT EXISTS dead_at timestamptz;
        END IF;
${indexes.map((index) => createIndexIfMissing(index)).join('')}      END $$;
    `);
  };

  return migrate;
}
