// Small pools for tests of what the store does when a pg Pool is short of connections: each test
// makes its own (one connection unless told otherwise, ended after it), on one fresh table per file.
import type pg from 'pg';
import { afterAll, afterEach, beforeAll } from 'vitest';
import { freshTable, testPool } from './database.js';

/**
 * Registers its own hooks: call it inside the `describe`. `table` is set once the file's
 * `beforeAll` ran; `admin` made it, apart from the pools under test, and drops it at the end.
 */
export function poolsOnFreshTable(label: string) {
  const admin = testPool({ max: 1 });
  const pools: pg.Pool[] = [];
  let drop: () => Promise<void> = async () => undefined;
  const made = {
    admin,
    table: '',
    poolOf(options: pg.PoolConfig = {}): pg.Pool {
      const pool = testPool({ max: 1, ...options });
      pools.push(pool);
      return pool;
    },
  };
  beforeAll(async () => {
    ({ table: made.table, drop } = await freshTable(admin, label));
  });
  afterEach(async () => {
    for (const pool of pools.splice(0)) await pool.end();
  });
  afterAll(async () => {
    await drop();
    await admin.end();
  });
  return made;
}

/** True once a pool has nothing queued and every connection it made is back. */
export const idle = (pool: pg.Pool) => pool.waitingCount === 0 && pool.idleCount === pool.totalCount;
