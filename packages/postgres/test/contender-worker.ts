// One of the processes of multi-process.int.test.ts: its own pg Pool, its own engine over a
// postgresStore, waits for "go", then sends `concurrency` begin calls with one key at once. The side
// effect of an execution is an INSERT into PostgreSQL itself, so the parent counts executions in the
// database, not by trusting what any process says.
import { createIdempotency } from '@idem/core';
import pg from 'pg';
import { postgresStore } from '../src/index.js';

interface Config {
  url: string;
  table: string;
  effects: string;
  key: string;
  concurrency: number;
  transactional: boolean;
  /** Off behind a pooler in transaction mode (pgbouncer.audit.int.test.ts). Default true. */
  preparedStatements?: boolean;
}

const config = JSON.parse(process.argv[2] ?? '{}') as Config;
const pool = new pg.Pool({ connectionString: config.url, max: 8 });
pool.on('error', () => undefined);
const engine = createIdempotency({
  store: postgresStore({ client: pool, table: config.table, preparedStatements: config.preparedStatements ?? true }),
});
const send = (message: unknown) => new Promise<void>((resolve) => process.send?.(message, () => resolve()));
const body = (text: string) => ({
  status: 201,
  headers: { 'content-type': 'text/plain' },
  body: new TextEncoder().encode(text),
});

const attempt = async (): Promise<string> => {
  try {
    const started = await engine.begin({
      key: config.key,
      scope: 'user:1',
      operation: 'POST /charges',
      fingerprint: 'fp',
    });
    if (started.kind === 'replay') return 'replay';
    if (started.kind === 'reject') return started.error.code;
    const insert = `INSERT INTO "${config.effects}" (key, pid) VALUES ($1, $2)`;
    if (config.transactional) {
      const result = await engine.transaction(started.lease, async (tx: pg.PoolClient) => {
        await tx.query(insert, [config.key, process.pid]);
        return { value: undefined, response: body(String(process.pid)) };
      });
      return result.committed ? 'execute' : `transaction-${result.reason}`;
    }
    await pool.query(insert, [config.key, process.pid]);
    const completed = await engine.complete(started.lease, body(String(process.pid)));
    return completed.ok ? 'execute' : `complete-${completed.reason}`;
  } catch (error) {
    return `thrown: ${(error as Error).message}`;
  }
};

process.on('message', async (message) => {
  if (message !== 'go') return;
  const outcomes = await Promise.all(Array.from({ length: config.concurrency }, attempt));
  await send({ outcomes });
  await pool.end();
  process.exit(0);
});

await pool.query('SELECT 1');
await send('ready');
