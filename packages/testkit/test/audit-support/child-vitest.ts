// Runs one test file in a child vitest (the repository's config and its `unit` project, or a config
// of its own for a fixture, with the JSON reporter) and returns every test's result. describeStore() and describeAdapter() register vitest
// tests, and a failing one would fail the file that calls them: to ask "does the suite report this
// bug?" from a passing test, the suite runs in a child, exactly as a store or adapter author's own
// test file would, and the parent reads its report.
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

export interface ChildResult {
  ancestorTitles: string[];
  title: string;
  status: string;
  failureMessages: string[];
}

const root = join(dirname(fileURLToPath(import.meta.url)), '../../../..');

/** The config that runs the `*.fixture.ts` files (suites that fail on purpose, out of the main run). */
export const fixtureConfig = join(dirname(fileURLToPath(import.meta.url)), 'fixture.vitest.config.ts');

export function runChildVitest(
  file: string,
  env: Record<string, string>,
  extraArgs: readonly string[] = [],
  config?: string,
): Promise<ChildResult[]> {
  const vitest = join(dirname(createRequire(import.meta.url).resolve('vitest/package.json')), 'vitest.mjs');
  const output = join(tmpdir(), `idem-audit-${randomUUID()}.json`);
  // The parent's VITEST_* variables would make the child take itself for a worker of this run.
  const childEnv = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('VITEST')));
  Object.assign(childEnv, env);
  const where = config === undefined ? ['--project', 'unit'] : ['--config', config];
  const args = [vitest, 'run', ...where, relative(root, file), '--reporter=json', `--outputFile=${output}`];
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [...args, ...extraArgs],
      { cwd: root, env: childEnv, timeout: 240_000, maxBuffer: 64 * 1024 * 1024 },
      (error) => {
        try {
          const report = JSON.parse(readFileSync(output, 'utf8')) as {
            testResults: { assertionResults: ChildResult[] }[];
          };
          resolve(report.testResults.flatMap((result) => result.assertionResults));
        } catch (cause) {
          reject(new Error(`the child vitest wrote no report (${String(error)})`, { cause }));
        } finally {
          rmSync(output, { force: true });
        }
      },
    );
  });
}
