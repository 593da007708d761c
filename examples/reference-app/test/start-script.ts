import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll } from 'vitest';
import { restartablePorts } from './ports.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));

/** The port variables of `npm start`, in the order their ports are given. */
export const portVariables = ['AUTH_PORT', 'APP_PORT', 'GATEWAY_PORT', 'API_PORT', 'RECEIVER_PORT'];

/**
 * Spawns `npm start` (or its script) for the test file that calls this: each run on free ports and
 * an empty PGlite folder, in its own process group; whatever a run leaves behind is killed and
 * removed after the file's tests.
 *
 * @example
 * const { spawnApp } = startScript('idem-start-');
 * const { child, ports } = await spawnApp(process.execPath, ['examples/reference-app/start.mjs']);
 */
export function startScript(prefix: string) {
  const children: ChildProcess[] = [];
  const dataDirs: string[] = [];
  afterAll(async () => {
    for (const child of children) {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // the group is gone: nothing was left behind
      }
    }
    // The folder and the lock npm start keeps beside it (left by a run killed with SIGKILL).
    await Promise.all(
      dataDirs.flatMap((dir) => [dir, `${dir}.lock`]).map((path) => rm(path, { recursive: true, force: true })),
    );
  });
  return {
    async spawnApp(command: string, args: string[], overrides: Record<string, string> = {}) {
      const dir = await mkdtemp(join(tmpdir(), prefix));
      dataDirs.push(dir);
      const env: NodeJS.ProcessEnv = { ...process.env, DATA_DIR: dir };
      delete env.DATABASE_URL;
      delete env.REDIS_URL;
      // Vitest sets BASE_URL ('/', Vite's base path) in its own environment; it is no gateway URL.
      delete env.BASE_URL;
      const ports = await restartablePorts(portVariables.length);
      portVariables.forEach((name, index) => {
        env[name] = String(ports[index]);
      });
      Object.assign(env, overrides);
      const child = spawn(command, args, { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
      children.push(child);
      return { child, ports, dir };
    },
  };
}

const appFolder = fileURLToPath(new URL('..', import.meta.url));

/**
 * Runs one of the app's scripts as `npm run` does (tsx, from the app's folder) and resolves with its
 * exit code and output (stdout and stderr together). DATABASE_URL is left out unless `env` sets it,
 * so the script opens PGlite (in `DATA_DIR` when given).
 *
 * @example
 * const seeded = await runScript('src/seed.ts', [], { DATA_DIR: dir });
 */
export function runScript(
  script: string,
  args: string[],
  env: Record<string, string | undefined>,
): Promise<{ code: number | null; output: string }> {
  const environment: NodeJS.ProcessEnv = { ...process.env };
  delete environment.DATABASE_URL;
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined) delete environment[name];
    else environment[name] = value;
  }
  const child = spawn(process.execPath, ['--import', 'tsx', script, ...args], {
    cwd: appFolder,
    env: environment,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout?.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });
  child.stderr?.on('data', (chunk: Buffer) => {
    output += chunk.toString();
  });
  return new Promise((resolve) => child.once('exit', (code) => resolve({ code, output })));
}
