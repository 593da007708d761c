import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './redis-env.js';

/** A redis-server this test process started, on a loopback port. */
export interface RedisServerProcess {
  readonly port: number;
  readonly url: string;
  readonly child: ChildProcess;
  /** Stops the server (SIGKILL when `hard`, like a crash) and waits until it has exited. */
  stop(options?: { hard?: boolean }): Promise<void>;
}

const exited = (child: ChildProcess) =>
  new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', () => resolve());
  });

/**
 * Starts `redis-server` in the foreground as a child process, without persistence, and resolves when
 * it says it accepts connections. Rejects if it exits first (for example because the port was taken).
 * Port 0 takes a free port, and another one when that was taken before redis-server could bind it
 * (the suite's files run in parallel, each listening on ephemeral ports).
 */
export async function startRedisServer(port: number, extraArgs: readonly string[] = []): Promise<RedisServerProcess> {
  if (port !== 0) return startOn(port, extraArgs);
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOn(await freePort(), extraArgs);
    } catch (error) {
      if (!(error instanceof PortTakenError) || attempt === 5) throw error;
    }
  }
}

class PortTakenError extends Error {}

async function startOn(port: number, extraArgs: readonly string[]): Promise<RedisServerProcess> {
  const workDir = mkdtempSync(join(tmpdir(), 'idem-redis-server-'));
  const child = spawn(
    'redis-server',
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--daemonize',
      'no',
      ...extraArgs,
    ],
    // In a folder of its own: a replica's full sync writes the primary's RDB into its `dir` (the
    // working folder unless `--dir` is given), which left a dump.rdb in the repository.
    { stdio: ['ignore', 'pipe', 'pipe'], cwd: workDir },
  );
  // Its log (stdout): ready once it says so. A connect to the port is not enough: another process
  // may hold the port (redis-server then exits), and the test would talk to that one.
  let log = '';
  let ready = false;
  child.stdout?.on('data', (chunk) => {
    if (ready) return;
    log += chunk;
    if (log.includes('Ready to accept connections')) ready = true;
  });
  child.stderr?.on('data', (chunk) => {
    log += chunk;
  });
  const gone = exited(child);
  let dead = false;
  gone.then(() => {
    dead = true;
  });
  // Readiness, not a TTL: poll until it says it is ready or the process dies.
  const deadline = Date.now() + 10_000;
  while (!ready) {
    if (dead) {
      rmSync(workDir, { recursive: true, force: true });
      const message = `redis-server on port ${port} exited: ${log.trim().split('\n').slice(-3).join(' | ')}`;
      throw log.includes('Address already in use') ? new PortTakenError(message) : new Error(message);
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`redis-server on port ${port} did not start`);
    }
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    child,
    async stop({ hard = false } = {}) {
      if (!dead) child.kill(hard ? 'SIGKILL' : 'SIGTERM');
      await gone;
      rmSync(workDir, { recursive: true, force: true });
    },
  };
}
