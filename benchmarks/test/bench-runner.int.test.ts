// Runs `npm run bench -- --quick limits` for real (node:http and bare Fastify, no Redis or
// PostgreSQL needed) into scratch folders, and checks the shape of what the runner writes: the
// results file, the page and the chart, and that a quick run never writes the docs folder.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const out = mkdtempSync(join(tmpdir(), 'idem-bench-out-'));
const docs = mkdtempSync(join(tmpdir(), 'idem-bench-docs-'));

afterAll(() => {
  rmSync(out, { recursive: true, force: true });
  rmSync(docs, { recursive: true, force: true });
});

interface Contender {
  name: string;
  samples: Array<number | null>;
  median?: number;
  min?: number;
  max?: number;
  ratio?: { median: number; min: number; max: number };
  notMeasured?: string;
  latencyP99Ms?: number;
  cpuMicrosPerRequest?: { median: number; min: number; max: number };
  cpuRatio?: { median: number; min: number; max: number };
  details?: Array<{ statuses: Record<string, number>; latencyP99Ms: number; cpuMicrosPerRequest: number } | null>;
}

describe('npm run bench -- --quick limits', () => {
  it('writes a results file with medians, ratios to the baseline, and the page and chart beside it', () => {
    // The runner uses the Node that runs it (the repository pins Node 24 as `node_modules/.bin/node`).
    // The limits suite measures no idem package, so the build check is skipped (`--no-build`).
    const args = ['benchmarks/run.mjs', '--quick', '--no-build', '--out', out, '--docs', docs, 'limits'];
    const run = spawnSync(process.execPath, args, {
      cwd: root,
      encoding: 'utf8',
      timeout: 110_000,
    });
    expect(run.status, run.stderr).toBe(0);

    const files = readdirSync(out).sort();
    const json = files.find((file) => /^\d{4}-\d{2}-\d{2}-quick-limits\.json$/.test(file));
    expect(json, files.join(', ')).toBeDefined();
    const results = JSON.parse(readFileSync(join(out, json as string), 'utf8'));
    expect(results).toMatchObject({
      format: 'idem-bench/1',
      quick: true,
      suitesRun: ['limits'],
      settings: { rounds: 1, durationSeconds: 1, connections: 50, packages: 'dist' },
    });
    expect(results.machine.cpus).toBeGreaterThan(0);
    expect(results.targets).toEqual([]);

    const group = results.suites[0].groups[0];
    expect(group).toMatchObject({ id: 'limits-http', unit: 'req/s', baseline: 'node:http', rounds: 1 });
    const rows: Contender[] = group.contenders;
    expect(rows.map((row) => row.name)).toEqual(['node:http', 'bare fastify']);
    for (const row of rows) {
      expect(row.notMeasured, row.name).toBeUndefined();
      expect(row.samples).toHaveLength(1);
      expect(row.median).toBeGreaterThan(0);
      expect(row.min).toBe(row.median);
      expect(row.max).toBe(row.median);
      // Every answer of the window was the route's 201: the load measured the path it meant to.
      expect(Object.keys(row.details?.[0]?.statuses ?? {})).toEqual(['201']);
      expect(row.latencyP99Ms).toBeGreaterThanOrEqual(0);
      // The server's own CPU time over the window, per request: a server costs some µs per request,
      // and far less than the window's whole second.
      const cpu = row.details?.[0]?.cpuMicrosPerRequest as number;
      expect(cpu, row.name).toBeGreaterThan(1);
      expect(cpu, row.name).toBeLessThan(10_000);
      expect(row.cpuMicrosPerRequest?.median).toBe(cpu);
    }
    const [baseline, fastify] = rows as [Contender, Contender];
    expect(baseline.ratio).toBeUndefined();
    // The ratio is the same round's sample over the baseline's, not a figure from elsewhere.
    expect(fastify.ratio?.median).toBeCloseTo((fastify.samples[0] as number) / (baseline.samples[0] as number), 10);
    // The CPU ratio is the baseline's CPU per request over this one's (1 = no overhead).
    expect(baseline.cpuRatio).toBeUndefined();
    expect(fastify.cpuRatio?.median).toBeCloseTo(
      (baseline.cpuMicrosPerRequest?.median as number) / (fastify.cpuMicrosPerRequest?.median as number),
      10,
    );

    const page = readFileSync(join(out, (json as string).replace(/\.json$/, '.md')), 'utf8');
    expect(page).toMatch(/^# Benchmarks \(quick mode/);
    expect(page).toContain('| bare fastify |');
    expect(page).toContain('server CPU µs/request, median (CPU ratio to "node:http") |');
    expect(page).toContain(
      ` ${fastify.cpuMicrosPerRequest?.median.toFixed(1)} (${fastify.cpuRatio?.median.toFixed(2)}) |`,
    );
    const chart = readFileSync(join(out, (json as string).replace(/\.json$/, '.svg')), 'utf8');
    expect(chart).toMatch(/^<svg xmlns="http:\/\/www\.w3\.org\/2000\/svg"/);
    expect(readdirSync(docs)).toEqual([]);
  }, 120_000);
});
