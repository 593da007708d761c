// A records table whose text columns are varchar, which migrate() accepts ("varchar without a length
// is the same as text to PostgreSQL"), on a PGlite instance made with its own parser for varchar: the
// store's reads of its own rows must not go through it, as they do not for text.
import { PGlite } from '@electric-sql/pglite';
import { describe, expect, it } from 'vitest';
import { migrate, postgresStore, schemaStatements } from '../src/index.js';

const body = new Uint8Array([0, 1, 2, 255]);
const response = { status: 201, headers: { 'content-type': 'application/octet-stream' }, body, statusMessage: 'Fine' };

describe('PGlite made with its own varchar parser, on a table of varchar columns', () => {
  // Was wrong: the store passed PGlite its own parsers for text but not for varchar (1043), so the
  // instance's parser read `get()`'s state, token and fingerprint: a completed record read back as
  // an unusable one.
  it('reads the store rows as the strings they are: get and replay', async () => {
    const db = new PGlite({ parsers: { 1043: (value: string) => ({ appParsed: 1043, value }) } });
    try {
      const [create] = schemaStatements() as [string];
      await db.exec(create.replace(/^(\s+(?:id|state|token|fingerprint|status_message)\s+)text\b/gm, '$1varchar'));
      await migrate(db);
      const { rows } = await db.query<{ t: string }>(
        `SELECT format_type(atttypid, atttypmod) AS t FROM pg_attribute WHERE attrelid = 'idem_records'::regclass AND attname = 'token'`,
      );
      expect(rows[0]?.t).toBe('character varying');
      const store = postgresStore({ client: db });
      await store.claim({ id: 'k', token: 't1', fingerprint: 'fp', leaseMs: 60_000 });
      expect(await store.get('k')).toEqual({ state: 'in_progress', token: 't1', fingerprint: 'fp' });
      expect(await store.complete({ id: 'k', token: 't1', response, retentionMs: 60_000 })).toBe(true);
      expect(await store.get('k')).toEqual({ state: 'completed', token: 't1', fingerprint: 'fp', response });
      expect(await store.claim({ id: 'k', token: 't2', fingerprint: 'fp', leaseMs: 60_000 })).toEqual({
        claimed: false,
        record: { state: 'completed', token: 't1', fingerprint: 'fp', response },
      });
    } finally {
      await db.close();
    }
  });
});
