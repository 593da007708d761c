// Defined in @idem/core since every store refuses oversized responses; exported here as by @idem/redis.
export { isResponseTooLargeError, ResponseTooLargeError } from '@idem/core';
export {
  type PostgresStore,
  type PostgresStoreOptions,
  type PostgresTransaction,
  type PurgeOptions,
  postgresStore,
} from './postgres-store.js';
export { type MigrateOptions, migrate, schemaSql, schemaStatements } from './schema.js';
export type {
  PGliteLike,
  PGliteQueryOptions,
  PGliteTransactionLike,
  PgClientLike,
  PgPoolClientLike,
  PgPoolLike,
  PgQueryConfig,
  PgQueryResult,
  PostgresClient,
  SqlExecutor,
  SqlResult,
} from './sql-client.js';
export { defaultTable } from './table-name.js';
export { isTransientDatabaseError } from './unavailable.js';
