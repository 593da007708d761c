// Runs benchmarks/adapters-overhead.bench.mjs for real on its cheapest contenders (the bare
// Express route and the yardsticks, which need no built package) and checks what it reports.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));

interface Result {
  name: string;
  opsPerSecond: number;
  ratio: number;
  cpuMicrosPerRequest: number;
  cpuRatio: number;
}

describe('adapters-overhead.bench.mjs', () => {
  it('reports every contender named by --only, with rates, CPU per request and ratios to the first', () => {
    const args = [
      'benchmarks/adapters-overhead.bench.mjs',
      ...['--no-build', '--rounds', '1', '--duration', '1', '--connections', '4', '--frameworks', 'express'],
      ...['--only', 'bare,minimal-fresh,minimal-replay,calibration'],
    ];
    const run = spawnSync(process.execPath, args, { cwd: root, encoding: 'utf8', timeout: 60_000 });
    expect(run.status, run.stderr).toBe(0);
    const last = run.stdout.trim().split('\n').at(-1) ?? '';
    const { benchmark, results } = JSON.parse(last) as { benchmark: string; results: Result[] };
    expect(benchmark).toBe('adapters-overhead');
    expect(results.map((result) => result.name)).toEqual([
      'express, bare route',
      'express, minimal layer fresh keys',
      'express, minimal layer replays',
      'express, bare route + 5 µs busy work',
    ]);
    for (const result of results) {
      expect(result.opsPerSecond).toBeGreaterThan(0);
      expect(result.cpuMicrosPerRequest).toBeGreaterThan(0);
      expect(result.ratio).toBeGreaterThan(0);
    }
    // The first contender is the base of every ratio.
    expect(results[0]?.ratio).toBe(1);
    expect(results[0]?.cpuRatio).toBe(1);
  }, 90_000);

  it('refuses a contender it does not know', () => {
    const run = spawnSync(process.execPath, ['benchmarks/adapters-overhead.bench.mjs', '--only', 'bare,nope'], {
      cwd: root,
      encoding: 'utf8',
    });
    expect(run.status).not.toBe(0);
    expect(run.stderr).toContain('--only names nope');
  });
});
