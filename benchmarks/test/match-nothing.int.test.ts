// `--match` with a text that names no contender (a typo, a wrong case) measured nothing for it and
// said nothing: the run wrote an empty page and exited 0. It now says which texts measured nothing,
// and a run in which none measured anything fails without writing a page.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { unmatchedTexts } from '../lib/rounds.mjs';

const root = fileURLToPath(new URL('../..', import.meta.url));
const out = mkdtempSync(join(tmpdir(), 'idem-bench-match-'));

afterAll(() => rmSync(out, { recursive: true, force: true }));

const groups = [
  {
    baseline: 'node:http',
    contenders: [{ name: 'node:http' }, { name: 'bare fastify' }],
  },
];

describe('--match', () => {
  it('names the texts that measured no contender beside a baseline', () => {
    expect(unmatchedTexts('fastify', groups)).toEqual([]);
    expect(unmatchedTexts('fastify|Fastify|node:http', groups)).toEqual(['Fastify', 'node:http']);
    expect(unmatchedTexts('anything', [])).toEqual(['anything']);
  });

  it('fails the run, writing nothing, when no text measured anything', () => {
    const args = ['benchmarks/run.mjs', '--no-build', '--match', 'no such contender', '--out', out, '--docs', out];
    const run = spawnSync(process.execPath, [...args, 'limits'], { cwd: root, encoding: 'utf8', timeout: 50_000 });
    expect(run.status, run.stdout).toBe(2);
    expect(run.stderr).toContain('--match measured nothing: no contender of limits contains "no such contender"');
    expect(readdirSync(out)).toEqual([]);
  }, 60_000);
});
