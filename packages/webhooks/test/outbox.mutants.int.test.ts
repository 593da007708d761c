import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type AttemptRecord, createOutbox, createSender } from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

// Tests written by a mutation-testing pass over outbox.ts: each kills a mutant the other outbox
// tests let live (named in its comment). Real PostgreSQL.

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('outbox mutants');

describe.skipIf(!available)('outbox attempts (mutants)', () => {
  const pool = testPool();
  const table = uniqueTable('mutants');
  const outbox = createOutbox({ table });
  beforeAll(() => outbox.migrate(pool));
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  // Kills: a wait recorded (and told) for an attempt that is not followed by one: delivered, or dead.
  it('records and tells no wait after a delivered attempt nor after one that dead-letters the row', async () => {
    const server = createServer((request, response) => {
      response.statusCode = request.url?.endsWith('/gone') ? 410 : 200;
      response.end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      await outbox.add(pool, { id: 'M1', url: `${base}/ok`, body: '{}' });
      await outbox.add(pool, { id: 'M2', url: `${base}/gone`, body: '{}' });
      const told: AttemptRecord[] = [];
      const relay = outbox.relay({
        db: pool,
        sender: createSender({ secret: SECRET, timeout: '5s' }),
        onAttempt: (_row, attempt) => void told.push(attempt),
      });
      expect(await relay.runOnce()).toMatchObject({ claimed: 2, delivered: 1, dead: 1 });
      const { rows } = await pool.query(`SELECT id, status, history FROM "${table}" ORDER BY id`);
      expect(rows.map((row) => [row.id, row.status])).toEqual([
        ['M1', 'delivered'],
        ['M2', 'dead'],
      ]);
      for (const row of rows) expect(row.history[0]).not.toHaveProperty('waitMs');
      expect(told).toHaveLength(2);
      for (const attempt of told) expect(attempt).not.toHaveProperty('waitMs');
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
