// Scenario 7: webhooks with receivers that die mid-apply. Two receiver processes (the transactional
// PostgreSQL receiver of @idem/webhooks) share one database; each dies by SIGKILL inside the apply
// transaction for ~15% of the events it sees and after COMMIT but before the acknowledgement for
// ~10%, and is restarted (a new generation, dying on other events). The @idem/webhooks sender
// delivers every event through a small load balancer (its `fetch` option) to whichever receiver is
// up, retrying refused connections, lost acknowledgements and 409s. Every event is applied exactly
// once. The lossy-link half of this (answers dropped on the wire) is the webhooks package's own
// e2e test; it is not repeated here.
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { migrate } from '@idem/postgres';
import { createSender } from '@idem/webhooks';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startWorkers, type Workers } from '../../src/workers.js';
import { chaos, databaseUrl, figures, pause, postgresAvailable } from './support.js';

const available = await postgresAvailable();
const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const script = fileURLToPath(new URL('./fixtures/receiver-worker.ts', import.meta.url));
const events = chaos ? 400 : 60;

describe.runIf(available)('webhook receivers killed mid-apply (transactional PostgreSQL)', () => {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
  pool.on('error', () => undefined);
  const suffix = randomUUID().slice(0, 8);
  const table = `idem_rel_hooks_${suffix}`;
  const effects = `${table}_fx`;
  let group: Workers;
  let generation = 0;
  let kills = 0;
  let closing = false;
  const restarting = new Set<number>();

  // Restarts a receiver whenever it dies, with a new generation (so it dies on other events).
  const supervise = (index: number) => {
    void group.workers[index]!.exited.then(async () => {
      if (closing) return;
      kills++;
      restarting.add(index);
      generation++;
      await group.restart(index);
      restarting.delete(index);
      supervise(index);
    });
  };

  beforeAll(async () => {
    await migrate(pool, { table });
    await pool.query(
      `CREATE TABLE "${effects}" (n serial PRIMARY KEY, key text NOT NULL, execution text NOT NULL, worker int NOT NULL)`,
    );
    group = await startWorkers({
      count: 2,
      script,
      readyTimeoutMs: 40_000,
      env: () => ({
        STORE_URL: databaseUrl,
        TABLE: table,
        EFFECTS: effects,
        WEBHOOK_SECRET: SECRET,
        LEASE_MS: '500',
        CRASH_IN_APPLY: '0.15',
        CRASH_BEFORE_ACK: '0.1',
        GENERATION: String(generation),
      }),
    });
    supervise(0);
    supervise(1);
  });

  afterAll(async () => {
    closing = true;
    // A restart still under way would leave its new process behind: let it finish, then stop all.
    while (restarting.size > 0) await pause(50);
    await group?.close();
    await pool.query(`DROP TABLE IF EXISTS "${effects}"`);
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });

  it(`${events} events, receivers killed mid-apply and before the ack: each applied exactly once`, async () => {
    let turn = 0;
    // The load balancer: each attempt goes to the next receiver, whatever state it is in.
    const balanced: typeof fetch = (input, init) => {
      const worker = group.workers[turn++ % group.workers.length]!;
      const url = new URL(String(input instanceof Request ? input.url : input));
      const target = new URL(worker.url);
      url.host = target.host;
      return fetch(url, init);
    };
    let attempts = 0;
    const sender = createSender({
      secret: SECRET,
      fetch: balanced,
      timeout: '3s',
      // Enough attempts to outlast both receivers restarting at once on a loaded box (a few seconds).
      schedule: { maxAttempts: 300, base: '20ms', cap: '300ms', maxRetryAfter: '300ms' },
      onAttempt: () => {
        attempts++;
      },
    });
    const ids = Array.from({ length: events }, (_, i) => `evt_${suffix}_${i}`);
    const results: Array<{ id: string; outcome: string }> = [];
    // Eight senders at a time, like a delivery worker pool.
    const queue = [...ids];
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        for (let id = queue.shift(); id !== undefined; id = queue.shift()) {
          const body = Buffer.from(JSON.stringify({ type: 'payment.succeeded', data: { id } }));
          const result = await sender.send({ url: 'http://receiver.invalid/hooks', id, body });
          results.push({ id, outcome: result.outcome });
        }
      }),
    );

    expect(results.filter((r) => r.outcome !== 'delivered')).toEqual([]);
    const { rows } = await pool.query(`SELECT key, count(*)::int AS n FROM "${effects}" GROUP BY key`);
    const applied = new Map(rows.map((row) => [row.key as string, row.n as number]));
    expect(applied.size).toBe(events);
    for (const id of ids) expect(applied.get(id), id).toBe(1);
    // The faults did happen: otherwise this proves nothing.
    expect(kills).toBeGreaterThan(0);
    figures('webhook-crash postgres-tx', {
      events,
      attempts,
      receiverKills: kills,
      applied: [...applied.values()].reduce((a, b) => a + b, 0),
      appliedTwice: [...applied.values()].filter((n) => n > 1).length,
      lost: events - applied.size,
    });
  });
});
