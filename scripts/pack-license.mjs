// npm puts a package's LICENSE into its tarball only from the package's own folder, and the
// packages share the repository's one licence text. `prepack` copies it in (after a fresh build, so
// a tarball never carries a stale dist) and `postpack` takes the copy away again; the copies are
// git-ignored, so there is one text to maintain.
//
//   node ../../scripts/pack-license.mjs           copy ../../LICENSE into the current package
//   node ../../scripts/pack-license.mjs --remove  delete that copy
import { copyFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const source = fileURLToPath(new URL('../LICENSE', import.meta.url));
const target = join(process.cwd(), 'LICENSE');

if (target === source) throw new Error('pack-license.mjs runs from a package folder, not the repository root');
if (process.argv.includes('--remove')) rmSync(target, { force: true });
else copyFileSync(source, target);
