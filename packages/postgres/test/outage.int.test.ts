// PostgreSQL connections terminated mid-load (pg_terminate_backend, as a failover or an operator
// would): every request ends as a success or as store_unavailable, none hangs, no unhandled
// rejection escapes, and service is normal again right after.
import { randomUUID } from 'node:crypto';
import { createIdempotency, type IdempotencyEngine } from '@idem/core';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresStore } from '../src/index.js';
import { freshTable, postgresAvailable, sql, testPool } from './database.js';

const available = await postgresAvailable();
const workers = 16;
const body = (text: string) => ({ status: 201, headers: {}, body: new TextEncoder().encode(text) });

type Outcome = 'success' | 'unavailable' | `other: ${string}`;

describe.runIf(available)('PostgreSQL outage mid-load', () => {
  const applicationName = `idem-outage-${randomUUID().slice(0, 8)}`;
  let pool: pg.Pool;
  let admin: pg.Pool;
  let table: string;
  let drop: () => Promise<void>;
  let effects: string;
  let engine: IdempotencyEngine;
  let poolErrors = 0;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);

  beforeAll(async () => {
    admin = testPool({ max: 2 });
    ({ table, drop } = await freshTable(admin, 'outage'));
    effects = `${table}_effects`;
    await sql(admin, `CREATE TABLE "${effects}" (key text PRIMARY KEY)`);
    // Only this pool's connections carry this application_name, so the test kills nobody else's.
    pool = testPool({ max: 8, application_name: applicationName, connectionTimeoutMillis: 1000, query_timeout: 3000 });
    pool.removeAllListeners('error');
    pool.on('error', () => {
      poolErrors++;
    });
    engine = createIdempotency({ store: postgresStore({ client: pool, table }), lease: '2s', storeTimeout: '2s' });
    process.on('unhandledRejection', onUnhandled);
  });

  afterAll(async () => {
    process.off('unhandledRejection', onUnhandled);
    await pool?.end();
    await sql(admin, `DROP TABLE IF EXISTS "${effects}"`);
    await drop();
    await admin.end();
  });

  // One request as an adapter runs it: begin, then the handler (half of them in transactional
  // mode), then complete. Only a success or store_unavailable is an acceptable ending.
  const request = async (transactional: boolean): Promise<Outcome> => {
    const key = randomUUID();
    try {
      const started = await engine.begin({ key, scope: 'user:1', operation: 'POST /charges', fingerprint: 'fp' });
      if (started.kind === 'replay') return 'success';
      if (started.kind === 'reject')
        return started.error.code === 'store_unavailable' ? 'unavailable' : `other: ${started.error.code}`;
      if (transactional) {
        const result = await engine.transaction(started.lease, async (tx: pg.PoolClient) => {
          await tx.query(`INSERT INTO "${effects}" (key) VALUES ($1)`, [key]);
          return { value: undefined, response: body('ok') };
        });
        if (result.committed) return 'success';
        return result.reason === 'store-error' ? 'unavailable' : `other: ${result.reason}`;
      }
      await pool.query(`INSERT INTO "${effects}" (key) VALUES ($1)`, [key]).catch(() => undefined);
      const completed = await engine.complete(started.lease, body('ok'));
      if (completed.ok) return 'success';
      return completed.reason === 'store-error' ? 'unavailable' : `other: ${completed.reason}`;
    } catch (error) {
      // The handler's own query on a terminated connection surfaces as StoreUnavailableError.
      if ((error as { code?: string }).code === 'store_unavailable') return 'unavailable';
      return `other: ${(error as Error).message}`;
    }
  };

  it('answers only successes and store_unavailable, never hangs, and recovers', async () => {
    const outcomes: Outcome[] = [];
    let slowest = 0;
    let running = true;
    const loops = Array.from({ length: workers }, async (_, w) => {
      for (let i = 0; running; i++) {
        const began = performance.now();
        outcomes.push(await request((w + i) % 2 === 0));
        slowest = Math.max(slowest, performance.now() - began);
      }
    });

    let terminated = 0;
    for (let round = 0; round < 4; round++) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      const rows = await sql(
        admin,
        'SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = $1',
        [applicationName],
      );
      terminated += rows[0].n;
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
    running = false;
    await Promise.all(loops);

    const tally: Record<string, number> = {};
    for (const outcome of outcomes) tally[outcome] = (tally[outcome] ?? 0) + 1;
    expect(terminated).toBeGreaterThan(0);
    expect(Object.keys(tally).filter((k) => k !== 'success' && k !== 'unavailable')).toEqual([]);
    expect(tally.success ?? 0).toBeGreaterThan(0);
    // The terminations were felt: requests got 503s, or idle connections died (and were replaced).
    expect((tally.unavailable ?? 0) + poolErrors).toBeGreaterThan(0);
    // Bounded by the engine's storeTimeout and the pool's timeouts, never by luck.
    expect(slowest).toBeLessThan(8_000);
    expect(unhandled).toEqual([]);

    // Recovery: right after, every request succeeds again.
    const after: Outcome[] = [];
    for (let i = 0; i < 20; i++) after.push(await request(i % 2 === 0));
    expect(after).toEqual(Array(20).fill('success'));
  });
});
