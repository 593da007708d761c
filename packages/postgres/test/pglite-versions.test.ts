// PGlite's own type changed across the versions the peer range admits (`>=0.2.0 <0.6.0`): before
// 0.2.16 its `transaction()` is declared to resolve to `T | undefined`. Those clients must be
// accepted as they are, without a cast (this file is type-checked in CI), and the transactional mode
// must not depend on what `transaction()` resolves to.
import { PGlite } from '@electric-sql/pglite';
import { describe, expect, it } from 'vitest';
import { migrate, type PGliteTransactionLike, postgresStore } from '../src/index.js';

// The shape of PGlite 0.2.0 to 0.2.15, as far as the store uses it.
interface PGliteBefore0216 {
  query<Row>(text: string, params?: any[]): Promise<{ rows: Row[]; affectedRows?: number }>;
  transaction<T>(callback: (tx: PGliteTransactionLike) => Promise<T>): Promise<T | undefined>;
}

describe('PGlite before 0.2.16 (transaction() declared as T | undefined)', () => {
  it('is taken by migrate() and postgresStore() without a cast, and transactions report what they did', async () => {
    // Was a defect: PGliteLike required `Promise<T>`, so `postgresStore({ client: db })` did not
    // compile, and the transactional mode returned what transaction() resolved to (undefined here).
    const real = new PGlite();
    try {
      // Resolves to undefined whatever the callback returned, as the loosest of those versions may.
      const db: PGliteBefore0216 = {
        query: (text, params) => real.query(text, params),
        transaction: async (callback) => {
          await real.transaction(callback);
          return undefined;
        },
      };
      await migrate(db, { table: 'idem_old_pglite' });
      const store = postgresStore({ client: db, table: 'idem_old_pglite' });
      expect(await store.claim({ id: 'r1', token: 't1', fingerprint: 'f', leaseMs: 60_000 })).toEqual({
        claimed: true,
      });
      const response = { status: 201, headers: {}, body: new Uint8Array([1]) };
      const run = () => Promise.resolve({ value: 'ran', response, retentionMs: 60_000 });
      // Another token: the record is not this run's, so the transaction rolls back.
      expect(await store.transaction({ id: 'r1', token: 'not-t1' }, run)).toEqual({ committed: false });
      expect(await store.transaction({ id: 'r1', token: 't1' }, run)).toEqual({ committed: true, value: 'ran' });
      expect((await store.get('r1'))?.state).toBe('completed');
    } finally {
      await real.close();
    }
  });
});
