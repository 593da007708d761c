// The benchmarks measure idem as `npm install` delivers it: each package's built `dist`, not its
// TypeScript sources run through tsx (whose transform keeps function names with a helper called at
// run time, and which cost the adapters 3 to 7 µs per request against their dist). So the runner
// builds first when a package's dist is missing or older than its sources.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The workspace packages whose `dist` is missing or older than a file of their `src`.
 *
 * @example
 * staleBuilds('/repo'); // ['@idem/core'] after an edit to packages/core/src
 */
export function staleBuilds(root) {
  const stale = [];
  const packages = join(root, 'packages');
  for (const name of readdirSync(packages)) {
    const dir = join(packages, name);
    const manifest = join(dir, 'package.json');
    if (!existsSync(manifest)) continue;
    const pkg = JSON.parse(readFileSync(manifest, 'utf8'));
    if (!pkg.scripts?.build) continue;
    const built = fileTimes(join(dir, 'dist'));
    const sources = fileTimes(join(dir, 'src'));
    if (built === undefined || (sources !== undefined && sources.newest > built.oldest)) stale.push(pkg.name);
  }
  return stale;
}

/**
 * Runs `npm run build` when a package is stale; throws when the build fails.
 *
 * @example
 * ensureBuilt('/repo');
 */
export function ensureBuilt(root) {
  const stale = staleBuilds(root);
  if (stale.length === 0) return;
  console.log(`building the packages first (the benchmarks measure their dist; stale: ${stale.join(', ')})`);
  const build = spawnSync('npm', ['run', 'build'], { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] });
  if (build.status !== 0) throw new Error(`npm run build failed (exit ${build.status})`);
}

// The oldest and newest modification times of the files under `dir`; undefined when it has none.
function fileTimes(dir) {
  if (!existsSync(dir)) return undefined;
  let oldest = Infinity;
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile()) continue;
    const time = statSync(join(entry.parentPath, entry.name)).mtimeMs;
    oldest = Math.min(oldest, time);
    newest = Math.max(newest, time);
  }
  return oldest === Infinity ? undefined : { oldest, newest };
}
