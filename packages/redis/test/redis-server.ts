import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

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

const accepts = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });

/**
 * Starts `redis-server` in the foreground as a child process, without persistence, and resolves when
 * it accepts connections. Rejects if it exits first (for example because the port was taken).
 */
export async function startRedisServer(port: number, extraArgs: readonly string[] = []): Promise<RedisServerProcess> {
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
    { stdio: ['ignore', 'ignore', 'pipe'], cwd: workDir },
  );
  let stderr = '';
  child.stderr?.on('data', (chunk) => {
    stderr += chunk;
  });
  const gone = exited(child);
  let dead = false;
  gone.then(() => {
    dead = true;
  });
  // Readiness, not a TTL: poll until the port answers or the process dies.
  const deadline = Date.now() + 10_000;
  while (!(await accepts(port))) {
    if (dead) {
      rmSync(workDir, { recursive: true, force: true });
      throw new Error(`redis-server on port ${port} exited: ${stderr.trim()}`);
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
