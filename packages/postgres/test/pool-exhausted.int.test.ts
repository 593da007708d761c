// Transactional mode on a pg Pool whose connections are all busy. Every other store call a request
// waits for is bounded by the engine's storeTimeout (a claim on an exhausted pool is a 503 within
// it), and DESIGN says a store that cannot serve is a 503 with Retry-After, never a hang. The
// transaction's own connection is not: `engine.transaction()` awaits the store's `pool.connect()`
// with no deadline, so with pg's defaults (connectionTimeoutMillis 0) a request whose claim went
// through waits for as long as another transactional handler holds the last connection, seconds or
// forever. Its heartbeat cannot renew meanwhile either (same pool), so its lease is reported lost
// while it still waits to begin.
import { randomUUID } from 'node:crypto';
import { createIdempotency, type IdempotencyEvent } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresStore } from '../src/index.js';
import { freshTable, postgresAvailable, testPool } from './database.js';

const available = await postgresAvailable();
const body = (text: string) => ({ status: 201, headers: {}, body: new TextEncoder().encode(text) });

describe.runIf(available)('transactional mode on an exhausted pool', () => {
  // pg's defaults: no connectionTimeoutMillis, so a connect waits until a connection is free.
  const pool = testPool({ max: 1 });
  let table: string;
  let drop: () => Promise<void>;

  beforeAll(async () => {
    ({ table, drop } = await freshTable(pool, 'exhausted'));
  });

  afterAll(async () => {
    await drop();
    await pool.end();
  });

  // Fails today: the second transaction settles only when the first lets its connection go (4 s
  // here, never if that handler hangs), with no store-error. Cause: engine.ts transaction() calls
  // store.transaction() without withTimeout, and postgres sql-client.ts pgPoolClient.transaction()
  // waits on pool.connect() unbounded.
  it.fails('a transaction that cannot get a connection is a store-error within storeTimeout, not a wait for the pool', async () => {
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: postgresStore({ client: pool, table }),
      lease: '1s',
      storeTimeout: '300ms',
      onEvent: (event) => events.push(event),
    });
    const begin = () =>
      engine.begin({ key: randomUUID(), scope: 'caller', operation: 'POST /orders', fingerprint: 'f' });
    // Both claims go through while the pool is free, as two requests arriving together do.
    const first = await begin();
    const second = await begin();
    if (first.kind !== 'execute' || second.kind !== 'execute') throw new Error('both keys are fresh');

    let open = () => {};
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    const holder = engine.transaction(first.lease, async () => {
      await gate;
      return { value: 1, response: body('first') };
    });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const timer = setTimeout(open, 4_000);
    try {
      const began = performance.now();
      const waiting = await engine.transaction(second.lease, async () => ({ value: 2, response: body('second') }));
      const took = performance.now() - began;
      // Bounded as a claim on the same pool would be: a few storeTimeouts at most, and a 503.
      expect(took).toBeLessThan(1_500);
      expect(waiting).toMatchObject({ committed: false, reason: 'store-error' });
      expect(events.some((event) => event.type === 'store-error' && event.phase === 'transaction')).toBe(true);
    } finally {
      open();
      clearTimeout(timer);
      await holder;
    }
  });
});
