// Adversarial review of preparing() (sql-client.ts): a named statement lost behind a transaction
// pooler is sent again unnamed. That is safe only if the lost statement never ran; these pin that a
// write re-sent this way takes effect exactly once (a second run would find its own write and answer
// "not the holder"), and that the names stay within PostgreSQL's 63-byte identifiers.
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresStore } from '../src/index.js';
import { buildStatements } from '../src/statements.js';
import { parseTableName } from '../src/table-name.js';
import { databaseUrl, freshTable, postgresAvailable } from './database.js';

const available = await postgresAvailable();

describe.runIf(available)('a write whose prepared statement the server session lost', () => {
  let table: string;
  let drop: () => Promise<void>;
  const setup = new pg.Pool({ connectionString: databaseUrl, max: 1 });

  beforeAll(async () => {
    ({ table, drop } = await freshTable(setup, 'audit_review2_prep'));
  });
  afterAll(async () => {
    await drop();
    await setup.end();
  });

  const response = { status: 201, headers: { 'content-type': 'text/plain' }, body: new Uint8Array([111, 107]) };

  it('complete, renew, release and forget each take effect once after DEALLOCATE ALL (26000) on a single pg Client', async () => {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    try {
      const store = postgresStore({ client, table });
      const ids = [randomUUID(), randomUUID(), randomUUID()];
      for (const id of ids) await store.claim({ id, token: `t-${id}`, fingerprint: 'fp', leaseMs: 5_000 });
      // Prepare complete, renew, release and forget on this session first, then take them away.
      const warm = randomUUID();
      await store.claim({ id: warm, token: 'w', fingerprint: 'fp', leaseMs: 5_000 });
      expect(await store.renew({ id: warm, token: 'w', leaseMs: 5_000 })).toBe(true);
      expect(await store.complete({ id: warm, token: 'w', response, retentionMs: 60_000 })).toBe(true);
      const again = randomUUID();
      await store.claim({ id: again, token: 'a', fingerprint: 'fp', leaseMs: 5_000 });
      expect(await store.release({ id: again, token: 'a' })).toBe(true);
      expect(await store.forget({ id: warm, token: 'w' })).toBe(true);
      await client.query('DEALLOCATE ALL');
      const [first, second, third] = ids as [string, string, string];
      expect(await store.renew({ id: first, token: `t-${first}`, leaseMs: 5_000 })).toBe(true);
      expect(await store.complete({ id: first, token: `t-${first}`, response, retentionMs: 60_000 })).toBe(true);
      expect(await store.release({ id: second, token: `t-${second}` })).toBe(true);
      expect(await store.forget({ id: third, token: `t-${third}` })).toBe(true);
      expect(await store.get(first)).toMatchObject({ state: 'completed' });
      expect(await store.get(second)).toBeUndefined();
      expect(await store.get(third)).toBeUndefined();
    } finally {
      await client.end();
    }
  });

  it("every statement's name fits PostgreSQL's 63-byte identifier, for the longest table name", () => {
    const table = parseTableName(`s${'x'.repeat(62)}.t${'y'.repeat(62)}`);
    for (const statusMessage of [true, false]) {
      const statements = buildStatements(table, 'f'.repeat(12), { statusMessage });
      const names = Object.values(statements).map((statement) => statement.name);
      expect(new Set(names).size).toBe(names.length);
      for (const name of names) expect(Buffer.byteLength(name)).toBeLessThanOrEqual(63);
    }
  });
});
