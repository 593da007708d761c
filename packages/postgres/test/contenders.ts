// The processes of the multi-process tests: each runs contender-worker.ts with its config, says
// 'ready' once connected, and reports its outcomes when told to go.
import { type ChildProcess, fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const worker = fileURLToPath(new URL('./contender-worker.ts', import.meta.url));
const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));

/** What a contender reports: one outcome per begin call it made. */
export interface ContenderReport {
  outcomes: string[];
}

/** Starts a contender process; resolves once it is ready, rejects if it exits first. */
export const startContender = (config: object) =>
  new Promise<ChildProcess>((resolve, reject) => {
    const child = fork(worker, [JSON.stringify(config)], {
      cwd: repoRoot,
      execArgv: ['--import', 'tsx'],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`worker exited early with ${code}`)));
    child.once('message', (message) => (message === 'ready' ? resolve(child) : reject(new Error(String(message)))));
  });

/** The report `child` sends once it has run; rejects if it exits before. */
export const contenderReport = (child: ChildProcess) =>
  new Promise<ContenderReport>((resolve, reject) => {
    child.removeAllListeners('exit');
    child.once('message', (message) => resolve(message as ContenderReport));
    child.once('exit', (code) => reject(new Error(`worker exited with ${code} before reporting`)));
  });
