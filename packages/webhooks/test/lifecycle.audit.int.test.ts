// Lifecycle audit (branch audit-lifecycle): the relay's start/stop in any order, against a real
// PostgreSQL outbox table and a real HTTP receiver.
import { memoryStore } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createReceiver, createSender } from '../src/index.js';
import { startEndpoint } from './support/endpoint.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const available = await postgresAvailable('lifecycle audit');

async function until(condition: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return true;
}

describe.skipIf(!available)('audit: relay start/stop order', () => {
  const pool = testPool();
  const table = uniqueTable('lifecycle');
  const outbox = createOutbox({ table });
  const sender = createSender({ secret: SECRET, timeout: '5s' });

  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  afterAll(async () => {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  // Was a defect: relay.start() called while a stop() is still settling is dropped in silence (`running` is still set, then stop() clears it), so `relay.stop(); relay.start();` leaves the relay stopped and nothing is ever delivered again.
  it('start() right after an un-awaited stop() runs the loop again (a restart delivers)', async () => {
    const applied: string[] = [];
    const receiver = createReceiver({
      store: memoryStore(),
      secret: SECRET,
      apply: (event) => void applied.push(event.id),
    });
    const endpoint = await startEndpoint(receiver);
    const relay = outbox.relay({ db: pool, sender, pollInterval: '10ms' });
    try {
      relay.start();
      const stopping = relay.stop();
      relay.start(); // a restart: the caller asks for the relay to run again
      await stopping;
      await outbox.add(pool, { id: 'restart_1', url: endpoint.url, body: '{}' });
      // A running relay polls every 10 ms: two seconds is ample.
      expect(await until(() => applied.length === 1, 2000)).toBe(true);
      expect(applied).toEqual(['restart_1']);
    } finally {
      await relay.stop();
      await endpoint.close();
    }
  });
});
