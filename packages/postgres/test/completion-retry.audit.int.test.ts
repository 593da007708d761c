// Adversarial review of the engine's background completion retry on a real PostgreSQL: a completion
// that timed out (storeTimeout) may still have landed, and the retry then meets its own outcome.
import { randomUUID } from 'node:crypto';
import { createIdempotency, type IdempotencyEvent, recordId } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresStore } from '../src/index.js';
import { freshTable, postgresAvailable, testPool } from './database.js';

const available = await postgresAvailable();
const response = { status: 201, headers: {}, body: new TextEncoder().encode('{"id":"ch_1"}') };

describe.runIf(available)('a completion retried after one that timed out but landed', () => {
  const admin = testPool({ max: 2 });
  const pool = testPool({ max: 3 });
  let table: string;
  let drop: () => Promise<void>;

  beforeAll(async () => {
    ({ table, drop } = await freshTable(admin, 'completion_retry'));
  });

  afterAll(async () => {
    await drop();
    await admin.end();
    await pool.end();
  });

  it('reports the stored outcome as stored, not as a lease lost to a fence', async () => {
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: postgresStore({ client: pool, table }),
      storeTimeout: '300ms',
      onEvent: (event) => events.push(event),
    });
    const request = { key: randomUUID(), scope: 'caller', operation: 'POST /charges', fingerprint: 'f' };
    const started = await engine.begin(request);
    if (started.kind !== 'execute') throw new Error('a fresh key executes');
    // Another session holds the row (a vacuum, an operator's query, a slow takeover attempt): the
    // completion's UPDATE waits on it past storeTimeout, then lands once the lock goes.
    const locker = await admin.connect();
    await locker.query('BEGIN');
    await locker.query(`SELECT id FROM "${table}" WHERE id = $1 FOR UPDATE`, [
      recordId(request.scope, request.operation, request.key),
    ]);
    const completed = await engine.complete(started.lease, response);
    expect(completed).toMatchObject({ ok: false, reason: 'store-error' });
    await locker.query('COMMIT');
    locker.release();

    // The outcome is stored (by the first UPDATE), and the retry replays it.
    await expect.poll(async () => (await engine.begin(request)).kind, { timeout: 5_000 }).toBe('replay');
    // The background retry meets the completed record: wait for what it reports, stored
    // ('complete') or fenced ('lease-lost'), rather than a fixed time.
    await expect
      .poll(() => events.some((event) => event.type === 'complete' || event.type === 'lease-lost'), { timeout: 5_000 })
      .toBe(true);
    const types = events.map((event) => event.type).filter((type) => type !== 'conflict' && type !== 'replay');
    // One handler, one stored outcome, no overlap: no `lease-lost` (reason `fenced` says a late
    // finisher was refused because another execution held the key, which never happened).
    expect(types).toEqual(['claim', 'store-error', 'complete']);
  });
});
