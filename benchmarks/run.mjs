// `npm run bench [-- --quick] [-- suite...]` (`--help` lists the options). What is measured is the
// packages as built (`dist`, rebuilt here first when stale), as `npm install` delivers them. The
// runner is started under tsx for the few TypeScript files it imports (the reference app, the core
// loop), with a tsconfig that leaves `@idem/*` to Node's resolution, which finds each package's dist.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureBuilt } from './lib/built.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
// Only a run that measures the packages needs them built, and --no-build measures them as they are.
const build = !argv.some((arg) => ['--no-build', '--render', '--list', '--help', '-h'].includes(arg));
if (build) ensureBuilt(dirname(here));
const child = spawn(process.execPath, ['--import', 'tsx', join(here, 'lib', 'main.mjs'), ...argv], {
  cwd: dirname(here),
  stdio: 'inherit',
  // Inherited by every child: under tsx, `@idem/*` then resolves to the built packages too.
  env: { ...process.env, TSX_TSCONFIG_PATH: join(here, 'tsconfig.built.json') },
});
// An interrupted run still stops its servers: they exit when the runner's IPC channel closes.
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => child.kill(signal));
child.on('exit', (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
