// The engine alone on memoryStore, in one process: benchmarks/core.bench.ts, run once per round in
// a child process of its own (it counts operations per second of its own CPU time, so the figure is
// the engine's cost, not a share of a busy box).
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
        resolve(Object.fromEntries(report.results.map((row) => [row.name, row.opsPerSecond])));
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
    // One child run measures both rows; the second contender reads what the first one's run found.
    let latest;
    const group = await runGroup(
      {
        id: 'core',
        title: 'Core engine on memoryStore: operations per CPU-second of one process',
        unit: 'ops/CPU-s',
        baseline: coreRow.fresh,
        note: "Counted per second of the process's own CPU time (user + system), 64 operations in flight. Target (issue 2): at least 300k begin+complete per second in one process.",
        contenders: [
          {
            name: coreRow.fresh,
            quick: true,
            measure: async () => {
              latest = await runCoreBench(settings.durationSeconds * 1_000);
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
    return { groups: [group] };
  },
};
