// `run.mjs --render` rewrites the page from a results file: the figures are the saved samples', and
// the explanations of the targets are those of lib/targets.mjs as it is now, not the saved text.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { redisRow } from '../suites/stores-redis.mjs';
import { row, savedRun } from './fixtures.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const scratch = mkdtempSync(join(tmpdir(), 'idem-bench-render-'));

afterAll(() => rmSync(scratch, { recursive: true, force: true }));

it('evaluates the targets again from the saved groups', () => {
  const ratio = { median: 0.35, min: 0.35, max: 0.35 };
  const saved = savedRun({
    suitesRun: ['stores-redis'],
    suites: [
      {
        id: 'stores-redis',
        title: 'Redis store',
        groups: [
          {
            id: 'stores-redis',
            title: 'Redis store: claim+complete vs raw SET NX PX',
            unit: 'ops/s',
            baseline: redisRow.raw(50),
            contenders: [row(redisRow.raw(50), 140_000), row(redisRow.store(50), 49_000, { ratio })],
          },
        ],
      },
    ],
    // What an older runner wrote: a verdict of its own and an explanation that is no longer current.
    targets: [
      {
        issue: 3,
        text: 'Redis store claim+complete / raw SET NX PX, 50 callers',
        group: 'stores-redis',
        threshold: 0.4,
        kind: 'ratio',
        whyIfMissed: 'an explanation from an older runner',
        measured: { median: 0.35, min: 0.35, max: 0.35 },
        verdict: 'missed',
      },
    ],
  });
  const file = join(scratch, 'results.json');
  writeFileSync(file, JSON.stringify(saved));
  const run = spawnSync(process.execPath, ['benchmarks/run.mjs', '--no-build', '--render', file, '--docs', scratch], {
    cwd: root,
    encoding: 'utf8',
    timeout: 60_000,
  });
  expect(run.status, run.stderr).toBe(0);
  const page = readFileSync(join(scratch, 'benchmarks.md'), 'utf8');
  expect(page).not.toContain('an explanation from an older runner');
  expect(page).toContain(
    '| 3 | Redis store claim+complete / raw SET NX PX, 50 callers | ≥ 0.40 | 0.35 (0.35 – 0.35) | missed |',
  );
  // 140,000 / 74,184 and 49,000 / 74,184: the run's own rates beside the reference box's.
  expect(page).toContain(
    "redis-benchmark's 50 clients ran at 140.0k ops/s in this run, 1.89× the 74.2k research/perf-limits.md measured on the reference box; the store ran at 49.0k cycles/s, 0.66 of that reference figure",
  );
  // Only the suites of the run are judged: no other issue's targets appear as not measured.
  expect(page).not.toContain('| 4 |');
});
