// The modules of every package, and of the reference app, import one another without a cycle, type-only
// imports included: a cycle makes module order matter (a value read before its module ran is
// undefined) and ties concepts that were split to be read apart. Seen and ended: guard.ts and
// internal-token.ts (the internal issuer's interface lived beside the issuer, which builds on the
// guard), the client's create-client.ts and redirects.ts (FetchFunction), the Redis store's
// command-runner.ts and runner-pool.ts (RedisCommandRunner).
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const sourceDirs = [
  ...readdirSync(join(root, 'packages')).map((folder) => join(root, 'packages', folder, 'src')),
  join(root, 'examples', 'reference-app', 'src'),
];

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return name.endsWith('.ts') ? [path] : [];
  });
}

/** The modules of its own source tree a module imports (`./guard.js` is `guard.ts`), as absolute paths. */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(/\bfrom\s+'(\.\.?\/[^']+)\.js'/g)].map((match) => resolve(dirname(file), `${match[1]}.ts`));
}

/** Every cycle in one source tree, each as the path from a module back to it. */
function cycles(dir: string): string[] {
  const graph = new Map(sourceFiles(dir).map((file) => [file, importsOf(file)]));
  const found: string[] = [];
  const done = new Set<string>();
  const walk = (file: string, path: string[]) => {
    const at = path.indexOf(file);
    if (at !== -1) {
      found.push([...path.slice(at), file].map((step) => relative(dir, step)).join(' -> '));
      return;
    }
    if (done.has(file)) return;
    for (const next of graph.get(file) ?? []) walk(next, [...path, file]);
    done.add(file);
  };
  for (const file of graph.keys()) walk(file, []);
  return found;
}

describe('module imports', () => {
  it('are read: the guard imports its engine, the reference app its database module', () => {
    expect(importsOf(join(root, 'packages/guard/src/guard.ts'))).toContain(join(root, 'packages/guard/src/engine.ts'));
    expect(importsOf(join(root, 'examples/reference-app/src/app/server.ts'))).toContain(
      join(root, 'examples/reference-app/src/db.ts'),
    );
  });

  it.each(sourceDirs.map((dir) => [relative(root, dir), dir]))('hold no cycle in %s', (_name, dir) => {
    expect(cycles(dir)).toEqual([]);
  });
});
