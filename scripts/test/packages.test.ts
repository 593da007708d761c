// What a user gets from `npm install @idem/<name>`: checks on every published package that need no
// build. Each package declares every module its sources import (else it works here, through the
// workspace's hoisted node_modules, and fails on a user's machine), pins its sibling packages at
// their current versions, and carries the licence text into its tarball.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const packagesDir = join(root, 'packages');

interface Manifest {
  name: string;
  version: string;
  license?: string;
  files?: string[];
  scripts?: Record<string, string>;
  dependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
}

const manifests = readdirSync(packagesDir).map((folder) => ({
  folder,
  manifest: JSON.parse(readFileSync(join(packagesDir, folder, 'package.json'), 'utf8')) as Manifest,
}));

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((entry) => {
    const path = join(dir, entry);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return path.endsWith('.ts') ? [path] : [];
  });
}

// Module specifiers of `import ... from 'x'`, `export ... from 'x'` and `import('x')` that are not
// type-only (those are erased from the JavaScript; their types come with the peers).
function importedModules(source: string): string[] {
  const found = new Set<string>();
  const statement = /^\s*(import|export)\s+(type\s+)?[^'";]*?from\s+['"]([^'"]+)['"]/gm;
  for (const match of source.matchAll(statement)) if (match[2] === undefined) found.add(match[3] as string);
  for (const match of source.matchAll(/^\s*import\s+['"]([^'"]+)['"]/gm)) found.add(match[1] as string);
  for (const match of source.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g)) found.add(match[1] as string);
  return [...found];
}

// The package a bare specifier names: `@scope/name/sub` is `@scope/name`, `name/sub` is `name`.
function packageOf(specifier: string): string {
  const parts = specifier.split('/');
  return specifier.startsWith('@') ? `${parts[0]}/${parts[1]}` : (parts[0] as string);
}

const builtins = new Set(builtinModules);

describe('published packages', () => {
  it('finds every package', () => {
    expect(manifests.map(({ manifest }) => manifest.name).sort()).toEqual(
      ['client', 'core', 'express', 'fastify', 'guard', 'koa', 'postgres', 'redis', 'testkit', 'webhooks'].map(
        (name) => `@idem/${name}`,
      ),
    );
  });

  for (const { folder, manifest } of manifests) {
    describe(manifest.name, () => {
      it('declares every module its sources import, as a dependency or a peer', () => {
        const declared = new Set([
          ...Object.keys(manifest.dependencies ?? {}),
          ...Object.keys(manifest.peerDependencies ?? {}),
        ]);
        const undeclared: string[] = [];
        for (const file of sourceFiles(join(packagesDir, folder, 'src'))) {
          for (const specifier of importedModules(readFileSync(file, 'utf8'))) {
            if (specifier.startsWith('.') || specifier.startsWith('node:') || builtins.has(specifier)) continue;
            if (!declared.has(packageOf(specifier))) undeclared.push(`${specifier} (${file.slice(root.length)})`);
          }
        }
        expect(undeclared).toEqual([]);
      });

      it('pins its sibling packages at their current versions', () => {
        for (const [name, range] of Object.entries(manifest.dependencies ?? {})) {
          const sibling = manifests.find((other) => other.manifest.name === name);
          if (sibling !== undefined) expect(range, name).toBe(sibling.manifest.version);
        }
      });

      // The tarball itself is not built here (a pack rebuilds dist, under the other tests' feet):
      // what is checked is the manifest that makes npm pack build, and copy the licence in.
      it('lists its build and README in files, and packs through prepack (build, licence) and postpack', () => {
        expect(manifest.license).toBe('MIT');
        expect(manifest.files).toEqual(expect.arrayContaining(['dist', 'README.md']));
        expect(statSync(join(packagesDir, folder, 'README.md')).isFile()).toBe(true);
        expect(manifest.scripts?.prepack).toBe('npm run build && node ../../scripts/pack-license.mjs');
        expect(manifest.scripts?.postpack).toBe('node ../../scripts/pack-license.mjs --remove');
      });
    });
  }

  it('pack-license.mjs copies the repository licence into the package folder, and removes it', () => {
    const folder = mkdtempSync(join(tmpdir(), 'idem-pack-license-'));
    try {
      const script = join(root, 'scripts', 'pack-license.mjs');
      const copy = spawnSync(process.execPath, [script], { cwd: folder, encoding: 'utf8' });
      expect(copy.status, copy.stderr).toBe(0);
      expect(readFileSync(join(folder, 'LICENSE'), 'utf8')).toBe(readFileSync(join(root, 'LICENSE'), 'utf8'));
      writeFileSync(join(folder, 'keep.txt'), 'x');
      const remove = spawnSync(process.execPath, [script, '--remove'], { cwd: folder, encoding: 'utf8' });
      expect(remove.status, remove.stderr).toBe(0);
      expect(readdirSync(folder)).toEqual(['keep.txt']);
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
  });

  it('pack-license.mjs refuses to run from the repository root, where it would delete the licence', () => {
    const run = spawnSync(process.execPath, [join(root, 'scripts', 'pack-license.mjs'), '--remove'], {
      cwd: root,
      encoding: 'utf8',
    });
    expect(run.status).not.toBe(0);
    expect(statSync(join(root, 'LICENSE')).isFile()).toBe(true);
  });
});
