// Four Node processes, each sending 50 concurrent begin calls with one key through the engine over
// one shared PostgreSQL table: the side effect, counted by rows in PostgreSQL, happens exactly once.
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { contenderReport as report, startContender as start } from './contenders.js';
import { databaseUrl, freshTable, postgresAvailable, sql, testPool } from './database.js';

const available = await postgresAvailable();
const processes = 4;
const concurrency = 50;

describe.runIf(available)('multi-process exactly-once on PostgreSQL', () => {
  let pool: pg.Pool;
  let table: string;
  let drop: () => Promise<void>;
  let effects: string;

  beforeAll(async () => {
    pool = testPool({ max: 2 });
    ({ table, drop } = await freshTable(pool, 'multi'));
    effects = `${table}_effects`;
    await sql(pool, `CREATE TABLE "${effects}" (key text NOT NULL, pid integer NOT NULL)`);
  });

  afterAll(async () => {
    await sql(pool, `DROP TABLE IF EXISTS "${effects}"`);
    await drop();
    await pool.end();
  });

  for (const transactional of [false, true]) {
    it(`${processes} processes x ${concurrency} concurrent requests, one key, ${transactional ? 'transactional mode' : 'claim then complete'}: one execution`, async () => {
      const key = randomUUID();
      const children = await Promise.all(
        Array.from({ length: processes }, () =>
          start({ url: databaseUrl, table, effects, key, concurrency, transactional }),
        ),
      );
      const reports = children.map(report);
      for (const child of children) child.send('go');
      const outcomes = (await Promise.all(reports)).flatMap((r) => r.outcomes);

      expect(outcomes).toHaveLength(processes * concurrency);
      const tally: Record<string, number> = {};
      for (const outcome of outcomes) tally[outcome] = (tally[outcome] ?? 0) + 1;
      // Zero errors: every request either executed, was refused as in progress, or got the replay.
      expect(Object.keys(tally).filter((k) => !['execute', 'in_progress', 'replay'].includes(k))).toEqual([]);
      expect(tally.execute).toBe(1);
      const rows = await sql(pool, `SELECT pid FROM "${effects}" WHERE key = $1`, [key]);
      expect(rows).toHaveLength(1);
    });
  }
});
