// PGlite (the embedded default) runs in-process, so these are unit tests: the shared contract, then
// the focused PostgreSQL behaviours.
import { PGlite } from '@electric-sql/pglite';
import { describeStore } from '@idem/testkit';
import { migrate, postgresStore } from '../src/index.js';
import { describePostgresBehaviour } from './behaviour.js';
import { harness } from './database.js';

describeStore('postgresStore on PGlite (in memory)', async () => {
  const db = new PGlite();
  await migrate(db, { table: 'idem_records' });
  const store = postgresStore({ client: db });
  return harness(db, store, () => db.close());
});

describePostgresBehaviour('PGlite (in memory)', async () => {
  const db = new PGlite();
  return { client: db, close: () => db.close() };
});
