// The engine alone on memoryStore, in one process: benchmarks/core.bench.ts, run once per round in
// a child process of its own. It reports operations per second of wall-clock time (what issue 2's
// target counts: per second, one process, a 2-core box) and per second of its own CPU time (user +
// system of every thread, the garbage collector's helpers on the other core included).
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runGroup } from '../lib/rounds.mjs';

const benchmarks = dirname(dirname(fileURLToPath(import.meta.url)));

/** Contender names, shared with the targets. */
export const coreRow = { fresh: 'begin+complete (fresh keys)', replay: 'replay' };

function runCoreBench(durationMs) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', join(benchmarks, 'core.bench.ts')], {
      cwd: dirname(benchmarks),
      env: { ...process.env, BENCH_MS: String(durationMs) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk) => {
      stdout += chunk;
    });
    child.stderr.on('data', (chunk) => {
      stderr = (stderr + chunk).slice(-2_000);
    });
    child.once('exit', (code) => {
      if (code !== 0)
        return reject(new Error(`core.bench.ts exited with ${code}: ${stderr.trim().split('\n').at(-1)}`));
      try {
        const report = JSON.parse(stdout.trim().split('\n').at(-1) ?? '');
        resolve({
          wall: Object.fromEntries(report.results.map((row) => [row.name, row.wallOpsPerSecond])),
          cpu: Object.fromEntries(report.results.map((row) => [row.name, row.opsPerSecond])),
        });
      } catch {
        reject(new Error(`core.bench.ts printed no results line: ${stdout.slice(-200)}`));
      }
    });
  });
}

/**
 * The core suite.
 *
 * @example
 * const { groups } = await coreSuite.run(settings, context);
 */
export const coreSuite = {
  id: 'core',
  title: 'Core engine on memoryStore (one process)',
  async run(settings, context) {
    // One child run measures every row of a group; the later contenders read what its first found.
    const groupOf = async ({ id, title, unit, note, rate }) => {
      let latest;
      return runGroup(
        {
          id,
          title,
          unit,
          baseline: coreRow.fresh,
          note,
          contenders: [
            {
              name: coreRow.fresh,
              quick: true,
              measure: async () => {
                // Forgotten first: a failed run must leave this round's replay row without a figure,
                // not with the previous round's.
                latest = undefined;
                latest = rate(await runCoreBench(settings.durationSeconds * 1_000));
                return latest[coreRow.fresh];
              },
            },
            {
              name: coreRow.replay,
              quick: true,
              measure: async () => {
                if (latest?.[coreRow.replay] === undefined) throw new Error('the begin+complete run failed');
                return latest[coreRow.replay];
              },
            },
          ],
        },
        settings,
        context.log,
      );
    };
    const wall = await groupOf({
      id: 'core',
      title: 'Core engine on memoryStore: operations per second of one process',
      unit: 'ops/s',
      note: 'Wall-clock rate of one process, 64 operations in flight, a store bounded at 50,000 records (full, so every claim also evicts). Target (issue 2): at least 300k begin+complete per second in one process on a 2-core box.',
      rate: (run) => run.wall,
    });
    const cpu = await groupOf({
      id: 'core-cpu',
      title: 'Core engine on memoryStore: operations per CPU-second of one process',
      unit: 'ops/CPU-s',
      note: "The same runs counted per second of the process's own CPU time, every thread's: V8's parallel scavenger works on the second core, so this rate is below the wall-clock one.",
      rate: (run) => run.cpu,
    });
    return { groups: [wall, cpu] };
  },
};
