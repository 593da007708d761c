// `npm run bench [-- --quick] [-- suite...]` (`--help` lists the options). The runner and every
// server it starts import this repository's TypeScript sources, so the runner itself is started
// under tsx here (which maps `@idem/*` to `packages/*/src` through the root tsconfig's `paths`).
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const child = spawn(process.execPath, ['--import', 'tsx', join(here, 'lib', 'main.mjs'), ...process.argv.slice(2)], {
  cwd: dirname(here),
  stdio: 'inherit',
});
// An interrupted run still stops its servers: they exit when the runner's IPC channel closes.
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => child.kill(signal));
child.on('exit', (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
