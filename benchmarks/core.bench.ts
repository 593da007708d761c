// Core engine throughput on memoryStore, in one process: begin+complete with fresh keys, and replays.
// Run: node --import tsx benchmarks/core.bench.ts. The store is bounded (50k records, oldest completed
// evicted first) so the figure is the engine's cost, not the garbage collector's cost of a growing heap.
import { createIdempotency, memoryStore, type StoredResponse } from '@idem/core';

const durationMs = Number(process.env.BENCH_MS ?? 2_000);
const concurrency = 64;
const response: StoredResponse = {
  status: 201,
  headers: { 'content-type': 'application/json' },
  body: new TextEncoder().encode('{"id":"ch_1"}'),
};

// Throughput is counted per second of wall-clock time (issue 2's measure) and per second of this
// process's own CPU time (user + system of all its threads, which other work on the machine barely
// moves, but which also charges the garbage collector's helper threads on the other core). `step` is
// one operation; each of `concurrency` workers calls it in a loop. The loop awaits `step` directly
// (no wrapper function per operation), so the harness adds as little as it can to what is measured.
async function measure(name: string, step: (i: number) => Promise<unknown>) {
  for (let i = 0; i < 20_000; i++) await step(-i - 1); // warm up the JIT
  let next = 0;
  let done = 0;
  const end = performance.now() + durationMs;
  const worker = async () => {
    while (performance.now() < end) {
      await step(next++);
      done++;
    }
  };
  const wallStart = performance.now();
  const cpuStart = process.cpuUsage();
  await Promise.all(Array.from({ length: concurrency }, worker));
  const cpu = process.cpuUsage(cpuStart);
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  const wallSeconds = (performance.now() - wallStart) / 1_000;
  return { name, opsPerSecond: Math.round(done / cpuSeconds), wallOpsPerSecond: Math.round(done / wallSeconds) };
}

const store = memoryStore({ maxEntries: 50_000 });
const engine = createIdempotency({ store });
const run = Date.now().toString(36);
const begin = (key: string) => engine.begin({ key, scope: 'user:1', operation: 'POST /charges', fingerprint: 'fp' });

// One begin+complete of a fresh key: a claim, then the outcome stored.
const fresh = await measure('begin+complete (fresh keys)', (i) =>
  begin(`${run}-${i}`).then((started) => {
    if (started.kind !== 'execute') throw new Error(`expected execute, got ${started.kind}`);
    return engine.complete(started.lease, response);
  }),
);

const first = await begin('replayed');
if (first.kind === 'execute') await engine.complete(first.lease, response);
const replay = await measure('replay', () =>
  begin('replayed').then((started) => {
    if (started.kind !== 'replay') throw new Error(`expected replay, got ${started.kind}`);
  }),
);

const results = { benchmark: 'core', node: process.version, durationMs, concurrency, results: [fresh, replay] };
for (const r of results.results) {
  console.log(
    `${r.name.padEnd(30)} ${r.wallOpsPerSecond.toLocaleString('en')}/s (${r.opsPerSecond.toLocaleString('en')} per CPU-second)`,
  );
}
console.log(JSON.stringify(results));
