// @idem/postgres claim+complete cycles per second, next to pgbench running the very same two
// statements against the same PostgreSQL in the same run, at 1 and 50 concurrent callers.
// Run: node --import tsx benchmarks/stores-postgres.bench.mjs (or `npm run bench -- stores-postgres`).
//
// Uses the PostgreSQL at DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test) and a table of
// its own, dropped at the end. The pgbench script is generated from the store's own SQL with the bind
// parameters written in as literals, so both sides run identical statements: the ratio is the cost of
// the store and the Node driver over the raw statements. The target is >= 0.80 at 50 callers.
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { createIdempotency } from '@idem/core';
import { migrate, postgresStore } from '@idem/postgres';
import pg from 'pg';
import { buildStatements } from '../packages/postgres/src/statements.ts';
import { parseTableName } from '../packages/postgres/src/table-name.ts';

const run = promisify(execFile);
const url = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const durationMs = Number(process.env.BENCH_MS ?? 3_000);
const seconds = Math.max(1, Math.round(durationMs / 1_000));
const table = `idem_bench_${randomUUID().slice(0, 8)}`;
const body = '{"id":"ch_1"}';
const headers = { 'content-type': 'application/json' };

const admin = new pg.Pool({ connectionString: url, max: 2 });
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
  const args = ['-n', '-f', script, '-c', String(clients), '-j', String(Math.min(clients, 2)), '-T', String(seconds)];
  const { stdout } = await run('pgbench', [...args, '-M', mode, url], { timeout: (seconds + 30) * 1_000 });
  const tps = Number(/tps = ([0-9.]+)/.exec(stdout)?.[1]);
  if (!Number.isFinite(tps)) throw new Error(`could not read pgbench output: ${stdout}`);
  const failed = Number(/number of failed transactions: (\d+)/.exec(stdout)?.[1] ?? 0);
  if (failed > 0) throw new Error(`pgbench reported ${failed} failed transactions`);
  return Math.round(tps);
};

// `callers` loops on a pool of `callers` connections, one cycle after the other, for durationMs.
const measure = async (callers, makeOperation) => {
  await reset();
  const pool = new pg.Pool({ connectionString: url, max: callers });
  pool.on('error', () => {});
  const operation = makeOperation(pool);
  for (let i = 0; i < 500; i++) await operation(); // warm up the JIT and the prepared statements
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

// Rounds interleave the contenders, and each figure is the median of its rounds: on a shared 2-core
// box the load moves during a run, and a side that ran only at a quiet moment would look better.
const rounds = process.env.BENCH_QUICK === '1' ? 1 : 3;
const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
};

try {
  const samples = { simple1: [], simple50: [], prepared1: [], prepared50: [], store1: [], store50: [], engine50: [] };
  for (let round = 0; round < rounds; round++) {
    samples.simple1.push(await pgbench(1, 'simple'));
    samples.store1.push(await measure(1, storeCycle));
    samples.prepared1.push(await pgbench(1, 'prepared'));
    samples.simple50.push(await pgbench(50, 'simple'));
    samples.store50.push(await measure(50, storeCycle));
    samples.prepared50.push(await pgbench(50, 'prepared'));
    samples.engine50.push(await measure(50, engineCycle));
  }
  const { simple1, simple50, prepared1, prepared50, store1, store50, engine50 } = Object.fromEntries(
    Object.entries(samples).map(([name, values]) => [name, median(values)]),
  );

  const results = [
    { name: 'pgbench claim+complete, 1 client (-M simple)', opsPerSecond: simple1 },
    { name: 'pgbench claim+complete, 50 clients (-M simple)', opsPerSecond: simple50 },
    { name: 'pgbench claim+complete, 1 client (-M prepared)', opsPerSecond: prepared1 },
    { name: 'pgbench claim+complete, 50 clients (-M prepared)', opsPerSecond: prepared50 },
    { name: 'postgresStore claim+complete, 1 caller', opsPerSecond: store1, ratio: store1 / simple1 },
    { name: 'postgresStore claim+complete, 50 callers', opsPerSecond: store50, ratio: store50 / simple50 },
    { name: 'postgresStore vs pgbench -M prepared, 1 caller', opsPerSecond: store1, ratio: store1 / prepared1 },
    { name: 'postgresStore vs pgbench -M prepared, 50 callers', opsPerSecond: store50, ratio: store50 / prepared50 },
    { name: 'engine begin+complete on postgresStore, 50 callers', opsPerSecond: engine50, ratio: engine50 / simple50 },
  ];
  for (const row of results) {
    const ratio = row.ratio === undefined ? '' : `  ratio ${row.ratio.toFixed(2)}`;
    console.log(`${row.name.padEnd(60)} ${String(row.opsPerSecond).padStart(8)}/s${ratio}`);
  }
  const note =
    "Ratios are store cycles/s over pgbench script runs/s at the same concurrency, both running the store's own claim and complete " +
    "statements as two autocommit transactions (synchronous_commit as configured on the server), first against pgbench's default " +
    'simple protocol, then against -M prepared. pgbench is C with 2 threads; the store is one Node process on the same 2 cores. ' +
    `Each figure is the median of ${rounds} interleaved round(s) of ${seconds} s. Target: >= 0.80 at 50 callers.`;
  console.log(JSON.stringify({ benchmark: 'PostgreSQL store: claim+complete vs pgbench', results, samples, note }));
} finally {
  await admin.query(`DROP TABLE IF EXISTS "${table}"`).catch(() => {});
  await admin.end();
  await rm(dir, { recursive: true, force: true });
}
