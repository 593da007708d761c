// Transactional mode across a crash: a process SIGKILLed between the handler's write and the commit
// leaves no trace (no effect row, no stored response), and once its short lease has run out, by the
// database's clock, a storm of retries executes exactly once.
import { fork } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { createIdempotency, type StoreRecord } from '@idem/core';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type PostgresStore, postgresStore } from '../src/index.js';
import { databaseUrl, freshTable, postgresAvailable, sql, testPool } from './database.js';

const available = await postgresAvailable();
const worker = fileURLToPath(new URL('./crash-worker.ts', import.meta.url));
const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));
const leaseMs = 300;
/** The crashed worker's fingerprint (crash-worker.ts): a hex SHA-256, kept by the engine as given. */
const crashed = 'f'.repeat(64);

describe.runIf(available)('transactional mode survives SIGKILL', () => {
  let pool: pg.Pool;
  let table: string;
  let drop: () => Promise<void>;
  let effects: string;
  let store: PostgresStore;

  beforeAll(async () => {
    pool = testPool({ max: 10 });
    ({ table, drop } = await freshTable(pool, 'crash'));
    effects = `${table}_effects`;
    // Unique like a real business key: the retry's write must wait for the dead transaction to end.
    await sql(pool, `CREATE TABLE "${effects}" (key text PRIMARY KEY, pid integer NOT NULL)`);
    store = postgresStore({ client: pool, table });
  });

  afterAll(async () => {
    await sql(pool, `DROP TABLE IF EXISTS "${effects}"`);
    await drop();
    await pool.end();
  });

  it('leaves no trace, and the retry after the lease executes exactly once', async () => {
    const key = randomUUID();
    const child = fork(worker, [JSON.stringify({ url: databaseUrl, table, effects, key, leaseMs })], {
      cwd: repoRoot,
      execArgv: ['--import', 'tsx'],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const exited = new Promise<NodeJS.Signals | null>((resolve) =>
      child.once('exit', (_code, signal) => resolve(signal)),
    );
    const written = await new Promise<{ written?: string; token?: string; error?: string }>((resolve, reject) => {
      child.once('message', (message) => resolve(message as { written?: string }));
      child.once('exit', (code) => reject(new Error(`worker exited with ${code} before writing`)));
    });
    expect(written.error).toBeUndefined();
    const id = written.written as string;

    // The child is inside its transaction, write done, commit not yet: the record is claimed.
    expect(await store.get(id)).toEqual({ state: 'in_progress', token: written.token, fingerprint: crashed });
    child.kill('SIGKILL');
    expect(await exited).toBe('SIGKILL');

    // No trace: the effect never committed and no response was stored.
    expect(await sql(pool, `SELECT * FROM "${effects}" WHERE key = $1`, [key])).toEqual([]);
    const record = await store.get(id);
    expect(record === undefined || record.state === 'in_progress').toBe(true);

    // Wait for the database clock to end the dead lease (poll the store; nothing is faked). The
    // record stays, abandoned, with the dead attempt's fingerprint.
    const deadline = Date.now() + 10 * leaseMs;
    let seen: StoreRecord | undefined = record;
    while (seen?.state === 'in_progress' && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 25));
      seen = await store.get(id);
    }
    expect(seen).toEqual({ state: 'abandoned', token: written.token, fingerprint: crashed });
    // Other parameters under the key are refused, never run (spec part 3, rule 2).
    const other = await createIdempotency({ store }).begin({
      key,
      scope: 'user:1',
      operation: 'POST /charges',
      fingerprint: 'other',
    });
    expect(other.kind === 'reject' && other.error.code).toBe('fingerprint_mismatch');

    // Ten concurrent retries with the same key, from two engines (as if two servers): one executes.
    // Only the dead worker's lease is short. The retries hold a long one: on a starved box a 300 ms
    // lease can lapse before its heartbeat runs, and a lost lease (rolled back, no effect) is not
    // what this test is about.
    const retryLease = 10_000;
    const engines = [createIdempotency({ store, lease: retryLease }), createIdempotency({ store, lease: retryLease })];
    const outcomes = await Promise.all(
      Array.from({ length: 10 }, async (_, i) => {
        const engine = engines[i % 2]!;
        const started = await engine.begin({ key, scope: 'user:1', operation: 'POST /charges', fingerprint: crashed });
        if (started.kind !== 'execute') return started.kind === 'reject' ? started.error.code : started.kind;
        const result = await engine.transaction(started.lease, async (tx: pg.PoolClient) => {
          await tx.query(`INSERT INTO "${effects}" (key, pid) VALUES ($1, $2)`, [key, process.pid]);
          return { value: 'done', response: { status: 201, headers: {}, body: new TextEncoder().encode('retried') } };
        });
        return result.committed ? 'execute' : `transaction-${result.reason}`;
      }),
    );
    expect(outcomes.filter((o) => o === 'execute')).toHaveLength(1);
    for (const outcome of outcomes) expect(['execute', 'in_progress', 'replay']).toContain(outcome);
    expect(await sql(pool, `SELECT pid FROM "${effects}" WHERE key = $1`, [key])).toEqual([{ pid: process.pid }]);
    const final = await store.get(id);
    expect(final?.state).toBe('completed');
  });
});
