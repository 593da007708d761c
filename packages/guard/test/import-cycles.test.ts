// The guard's modules import one another without a cycle, type-only imports included: a cycle
// makes module order matter (a value read before its module ran is undefined) and ties concepts
// that were split to be read apart. guard.ts and internal-token.ts once imported each other (the
// internal issuer's interface lived beside createInternalTokenIssuer, which builds on the guard).
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

const srcDir = new URL('../src/', import.meta.url);
const files = readdirSync(srcDir).filter((name) => name.endsWith('.ts'));

/** The package files a module imports, as file names (`./guard.js` is `guard.ts`). */
function importsOf(file: string): string[] {
  const text = readFileSync(new URL(file, srcDir), 'utf8');
  return [...text.matchAll(/\bfrom\s+'\.\/([\w-]+)\.js'/g)].map((match) => `${match[1]}.ts`);
}

/** Every cycle, each as the path from a module back to it. */
function cycles(): string[] {
  const graph = new Map(files.map((file) => [file, importsOf(file)]));
  const found: string[] = [];
  const done = new Set<string>();
  const walk = (file: string, path: string[]) => {
    const at = path.indexOf(file);
    if (at !== -1) {
      found.push([...path.slice(at), file].join(' -> '));
      return;
    }
    if (done.has(file)) return;
    for (const next of graph.get(file) ?? []) walk(next, [...path, file]);
    done.add(file);
  };
  for (const file of files) walk(file, []);
  return found;
}

describe('module imports of @idem/guard', () => {
  it('has modules that import one another', () => {
    expect(files.length).toBeGreaterThan(10);
    expect(importsOf('guard.ts')).toContain('engine.ts');
  });

  it('hold no import cycle', () => {
    expect(cycles()).toEqual([]);
  });
});
