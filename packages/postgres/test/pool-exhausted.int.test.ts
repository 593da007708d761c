// Transactional mode on a pg Pool whose connections are all busy. Every other store call a request
// waits for is bounded by the engine's storeTimeout (a claim on an exhausted pool is a 503 within
// it), and DESIGN says a store that cannot serve is a 503 with Retry-After, never a hang. The
// transaction's own connection is too: `engine.transaction()` once awaited the store's
// `pool.connect()` with no deadline, so with pg's defaults (connectionTimeoutMillis 0) a request
// whose claim went through waited for as long as another transactional handler held the last
// connection, seconds or forever. Now its transaction must begin within storeTimeout.
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

  it('a transaction that cannot get a connection is a store-error within storeTimeout, not a wait for the pool', async () => {
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

    let secondRan = false;
    let open = () => {};
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    // The first transaction has the pool's one connection once its callback runs: wait for that.
    let holding = () => {};
    const held = new Promise<void>((resolve) => {
      holding = resolve;
    });
    const holder = engine.transaction(first.lease, async () => {
      holding();
      await gate;
      return { value: 1, response: body('first') };
    });
    await held;
    const timer = setTimeout(open, 4_000);
    try {
      const began = performance.now();
      const waiting = await engine.transaction(second.lease, async () => {
        secondRan = true;
        return { value: 2, response: body('second') };
      });
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
    // Once the pool frees its connection, the transaction that began too late runs nothing.
    await expect.poll(() => pool.waitingCount === 0 && pool.idleCount === 1).toBe(true);
    expect(secondRan).toBe(false);
  });
});
