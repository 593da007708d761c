// The runner measures the built packages, so it must notice a dist that is missing or older than its
// sources; checked on a scratch tree with set modification times.
import { mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { staleBuilds } from '../lib/built.mjs';

const root = mkdtempSync(join(tmpdir(), 'idem-built-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

function write(path: string, text: string, secondsAgo: number) {
  mkdirSync(join(path, '..'), { recursive: true });
  writeFileSync(path, text);
  const time = Date.now() / 1000 - secondsAgo;
  utimesSync(path, time, time);
}

function pkg(name: string, build: boolean) {
  const dir = join(root, 'packages', name);
  write(
    join(dir, 'package.json'),
    JSON.stringify({ name: `@x/${name}`, scripts: build ? { build: 'tsup' } : {} }),
    100,
  );
  return dir;
}

describe('staleBuilds', () => {
  it('names packages whose dist is missing, empty or older than a source file, and only those', () => {
    const fresh = pkg('fresh', true);
    write(join(fresh, 'src', 'index.ts'), 'export {}', 60);
    write(join(fresh, 'dist', 'index.js'), 'export {}', 30);
    const edited = pkg('edited', true);
    write(join(edited, 'src', 'deep', 'a.ts'), 'export {}', 10);
    write(join(edited, 'src', 'index.ts'), 'export {}', 60);
    write(join(edited, 'dist', 'index.js'), 'export {}', 30);
    const unbuilt = pkg('unbuilt', true);
    write(join(unbuilt, 'src', 'index.ts'), 'export {}', 60);
    const emptyDist = pkg('emptied', true);
    write(join(emptyDist, 'src', 'index.ts'), 'export {}', 60);
    mkdirSync(join(emptyDist, 'dist'), { recursive: true });
    const noBuild = pkg('plain', false);
    write(join(noBuild, 'src', 'index.ts'), 'export {}', 60);

    expect(staleBuilds(root).sort()).toEqual(['@x/edited', '@x/emptied', '@x/unbuilt']);
  });
});
