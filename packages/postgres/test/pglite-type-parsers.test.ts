// PGlite's counterpart of pg's global type parsers: an instance made with its own `parsers`
// (`new PGlite({ parsers })`) reads every query through them, the store's too. The store reads its
// own rows with its own parsers, so a replay is the stored answer byte for byte; a transactional
// handler's own queries keep the instance's.
import { PGlite } from '@electric-sql/pglite';
import { describe, expect, it } from 'vitest';
import { migrate, postgresStore } from '../src/index.js';

// bool, bytea, int4, text, json, varchar, timestamptz, jsonb: each value comes back wrapped.
const oids = [16, 17, 23, 25, 114, 1043, 1184, 3802];
const hostile = Object.fromEntries(oids.map((oid) => [oid, (value: string) => ({ appParsed: oid, value })]));

const body = new Uint8Array([0, 1, 2, 0x5c, 0x78, 255, 10, 13, 0x27]);
// A reason phrase of the handler's own too: the store reads it back as text, through its own parser.
const response = {
  status: 201,
  headers: { 'content-type': 'application/octet-stream', etag: '"v1"' },
  body,
  statusMessage: 'Created Fine',
};

describe('PGlite made with its own parsers', () => {
  it('does not change what the store reads: migrate, claim, replay byte for byte', async () => {
    const db = new PGlite({ parsers: hostile });
    try {
      await migrate(db);
      await migrate(db);
      const store = postgresStore({ client: db });
      expect(await store.claim({ id: 'k', token: 't1', fingerprint: 'fp', leaseMs: 60_000 })).toEqual({
        claimed: true,
      });
      expect(await store.claim({ id: 'k', token: 't2', fingerprint: 'fp', leaseMs: 60_000 })).toEqual({
        claimed: false,
        record: { state: 'in_progress', token: 't1', fingerprint: 'fp' },
      });
      const result = await store.transaction({ id: 'k', token: 't1' }, async (tx) => {
        const { rows } = await tx.query<{ n: unknown }>('SELECT 7::int4 AS n');
        return { value: rows[0]?.n, response, retentionMs: 60_000 };
      });
      // The handler's own query is read with the instance's parsers.
      expect(result).toEqual({ committed: true, value: { appParsed: 23, value: '7' } });
      const replayed = await store.claim({ id: 'k', token: 't3', fingerprint: 'fp', leaseMs: 60_000 });
      expect(replayed).toEqual({
        claimed: false,
        record: { state: 'completed', token: 't1', fingerprint: 'fp', response },
      });
      const stored = replayed.claimed ? undefined : replayed.record;
      expect(stored?.state === 'completed' && Buffer.from(stored.response.body).equals(Buffer.from(body))).toBe(true);
    } finally {
      await db.close();
    }
  });
});
