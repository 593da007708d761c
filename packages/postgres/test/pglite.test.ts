// PGlite (the embedded default) runs in-process, so these are unit tests: the shared contract, then
// the focused PostgreSQL behaviours.
import { PGlite } from '@electric-sql/pglite';
import { describeStore } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
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

// Was a defect (found by an audit of PostgreSQL as it is deployed): with the table there, migrate()
// passed on a read-only session (a standby, `default_transaction_read_only = on` on the role or the
// database), and every request after it was a 503 (25006). It is refused at migrate() now.
describe('migrate() on a read-only session', () => {
  it('refuses, naming the cause, even when the table exists', async () => {
    const db = new PGlite();
    try {
      await migrate(db);
      await db.exec('SET default_transaction_read_only = on');
      await expect(migrate(db)).rejects.toThrow(/read-only/);
    } finally {
      await db.close();
    }
  });
});
