// The process crash.int.test.ts kills: it claims a key through the engine (short lease), enters
// transactional mode, writes the side effect, tells the parent "written", and then waits forever
// before the commit. The parent SIGKILLs it right there.
import { createIdempotency } from '@idem/core';
import pg from 'pg';
import { postgresStore } from '../src/index.js';

interface Config {
  url: string;
  table: string;
  effects: string;
  key: string;
  leaseMs: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as Config;
const pool = new pg.Pool({ connectionString: config.url, max: 4 });
pool.on('error', () => undefined);
const engine = createIdempotency({
  store: postgresStore({ client: pool, table: config.table }),
  lease: config.leaseMs,
});
const send = (message: unknown) => new Promise<void>((resolve) => process.send?.(message, () => resolve()));

// A hex SHA-256, as the adapters pass, so the record holds it as given (crash.int.test.ts reads it).
const fingerprint = 'f'.repeat(64);
const started = await engine.begin({ key: config.key, scope: 'user:1', operation: 'POST /charges', fingerprint });
if (started.kind !== 'execute') {
  await send({ error: `expected to execute, got ${started.kind}` });
  process.exit(1);
}
await engine.transaction(started.lease, async (tx: pg.PoolClient) => {
  await tx.query(`INSERT INTO "${config.effects}" (key, pid) VALUES ($1, $2)`, [config.key, process.pid]);
  await send({ written: started.lease.id, token: started.lease.token });
  // Never returns: the kill lands between the handler's write and the commit.
  return new Promise<never>(() => undefined);
});
