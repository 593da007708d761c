// @idem/postgres claim+complete cycles per second beside pgbench running the very same two
// statements against the same PostgreSQL in the same rounds, at 1 and 50 concurrent callers.
//
// Uses the PostgreSQL at DATABASE_URL and a table of its own, dropped at the end. The pgbench script
// is generated from the store's own SQL with the bind parameters written in as literals, so both
// sides run identical statements: the ratio is the cost of the store and the Node driver over the raw
// statements. The target is >= 0.80 at 50 callers.
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { runGroup } from '../lib/rounds.mjs';
import { databaseUrl } from '../servers/backends.mjs';

const run = promisify(execFile);

/** Contender names, shared with the targets. */
export const postgresRow = {
  simple: (clients) => `pgbench claim+complete, ${clients} client${clients === 1 ? '' : 's'} (-M simple)`,
  prepared: (clients) => `pgbench claim+complete, ${clients} client${clients === 1 ? '' : 's'} (-M prepared)`,
  store: (callers) => `postgresStore claim+complete, ${callers} caller${callers === 1 ? '' : 's'}`,
  engine: 'engine begin+complete on postgresStore, 50 callers',
};

/**
 * The PostgreSQL store suite (needs pgbench on the PATH and DATABASE_URL answering).
 *
 * @example
 * const { groups } = await storesPostgresSuite.run(settings, context);
 */
export const storesPostgresSuite = {
  id: 'stores-postgres',
  title: 'PostgreSQL store: claim+complete vs pgbench',
  async run(settings, context) {
    const down = context.unavailable('postgres');
    if (down) return { groups: [], notMeasured: [{ scenario: this.title, reason: down }] };
    try {
      await run('pgbench', ['--version']);
    } catch {
      return { groups: [], notMeasured: [{ scenario: this.title, reason: 'pgbench is not installed' }] };
    }
    const { createIdempotency } = await import('@idem/core');
    const { migrate, postgresStore } = await import('@idem/postgres');
    const { buildStatements } = await import('../../packages/postgres/src/statements.ts');
    const { parseTableName } = await import('../../packages/postgres/src/table-name.ts');
    const pg = (await import('pg')).default;
    const durationMs = settings.durationSeconds * 1_000;
    const seconds = settings.durationSeconds;
    const table = `idem_bench_${randomUUID().slice(0, 8)}`;
    const body = '{"id":"ch_1"}';
    const headers = { 'content-type': 'application/json' };

    const admin = new pg.Pool({ connectionString: databaseUrl, max: 2 });
    admin.on('error', () => {});
    await migrate(admin, { table });
    const reset = () => admin.query(`TRUNCATE "${table}"`);

    // The store's two statements with literals in place of $1..$n (highest first, so $1 never eats $10).
    const literal = (text, values) =>
      Object.keys(values)
        .sort((a, b) => Number(b) - Number(a))
        .reduce((sql, n) => sql.replaceAll(`$${n}`, values[n]), text);
    const statements = buildStatements(parseTableName(table), 'bench');
    const id = 'md5(:n::text)';
    const claimSql = literal(statements.claim.text, { 1: id, 2: "'tok'", 3: "'fp'", 4: '10000' });
    const completeSql = literal(statements.complete.text, {
      1: id,
      2: "'tok'",
      3: '201',
      4: `'${JSON.stringify(headers)}'`,
      5: `'\\x${Buffer.from(body).toString('hex')}'::bytea`,
      6: '86400000',
    });
    const dir = await mkdtemp(join(tmpdir(), 'idem-pgbench-'));
    const script = join(dir, 'claim-complete.sql');
    await writeFile(script, `\\set n random(1, 9000000000000000000)\n${claimSql};\n${completeSql};\n`);

    // pgbench: one transaction per statement (autocommit), like the store. `mode` is pgbench's -M.
    const pgbench = async (clients, mode) => {
      await reset();
      const args = [
        '-n',
        '-f',
        script,
        '-c',
        String(clients),
        '-j',
        String(Math.min(clients, 2)),
        '-T',
        String(seconds),
      ];
      const { stdout } = await run('pgbench', [...args, '-M', mode, databaseUrl], { timeout: (seconds + 30) * 1_000 });
      const tps = Number(/tps = ([0-9.]+)/.exec(stdout)?.[1]);
      if (!Number.isFinite(tps)) throw new Error(`could not read pgbench output: ${stdout}`);
      const failed = Number(/number of failed transactions: (\d+)/.exec(stdout)?.[1] ?? 0);
      if (failed > 0) throw new Error(`pgbench reported ${failed} failed transactions`);
      return Math.round(tps);
    };

    // `callers` loops on a pool of `callers` connections, one cycle after the other, for the window.
    const measure = async (callers, makeOperation) => {
      await reset();
      const pool = new pg.Pool({ connectionString: databaseUrl, max: callers });
      pool.on('error', () => {});
      const operation = makeOperation(pool);
      for (let i = 0; i < (settings.quick ? 50 : 200); i++) await operation(); // warm up the JIT and the prepared statements
      let done = 0;
      const started = performance.now();
      const end = started + durationMs;
      await Promise.all(
        Array.from({ length: callers }, async () => {
          while (performance.now() < end) {
            await operation();
            done++;
          }
        }),
      );
      const rate = Math.round(done / ((performance.now() - started) / 1_000));
      await pool.end();
      return rate;
    };

    const response = { status: 201, headers, body: new TextEncoder().encode(body) };
    const storeCycle = (pool) => {
      const store = postgresStore({ client: pool, table });
      return async () => {
        const recordId = randomUUID();
        const token = randomUUID();
        const claimed = await store.claim({ id: recordId, token, fingerprint: 'fp', leaseMs: 10_000 });
        if (!claimed.claimed) throw new Error('fresh id not claimed');
        if (!(await store.complete({ id: recordId, token, response, retentionMs: 86_400_000 }))) {
          throw new Error('complete refused');
        }
      };
    };
    const engineCycle = (pool) => {
      const engine = createIdempotency({ store: postgresStore({ client: pool, table }), heartbeat: false });
      return async () => {
        const started = await engine.begin({
          key: randomUUID(),
          scope: 'user:1',
          operation: 'POST /charges',
          fingerprint: 'fp',
        });
        if (started.kind !== 'execute') throw new Error(`expected execute, got ${started.kind}`);
        await engine.complete(started.lease, response);
      };
    };

    try {
      const group = await runGroup(
        {
          id: 'stores-postgres',
          title: 'PostgreSQL store: claim+complete cycles/s vs pgbench running the same statements',
          unit: 'cycles/s',
          baseline: postgresRow.simple(50),
          note:
            "Both sides run the store's own claim and complete statements as two autocommit transactions (synchronous_commit as the server has it). " +
            'pgbench is C with 2 threads; the store is one Node process on the same 2 cores. Target: >= 0.80 at 50 callers against -M simple.',
          contenders: [
            { name: postgresRow.simple(50), quick: true, measure: () => pgbench(50, 'simple') },
            { name: postgresRow.store(50), quick: true, measure: () => measure(50, storeCycle) },
            { name: postgresRow.prepared(50), measure: () => pgbench(50, 'prepared') },
            { name: postgresRow.engine, measure: () => measure(50, engineCycle) },
            { name: postgresRow.simple(1), measure: () => pgbench(1, 'simple') },
            { name: postgresRow.store(1), measure: () => measure(1, storeCycle) },
            { name: postgresRow.prepared(1), measure: () => pgbench(1, 'prepared') },
          ],
          comparisons: [
            [postgresRow.store(1), postgresRow.simple(1)],
            [postgresRow.store(50), postgresRow.simple(50)],
            [postgresRow.store(1), postgresRow.prepared(1)],
            [postgresRow.store(50), postgresRow.prepared(50)],
            [postgresRow.engine, postgresRow.simple(50)],
          ],
        },
        settings,
        context.log,
      );
      return { groups: [group] };
    } finally {
      await admin.query(`DROP TABLE IF EXISTS "${table}"`).catch(() => {});
      await admin.end();
      await rm(dir, { recursive: true, force: true });
    }
  },
};
