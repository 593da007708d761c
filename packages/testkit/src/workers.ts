import { type ChildProcess, spawn } from 'node:child_process';

/** Options of {@link startWorkers}. */
export interface WorkersOptions {
  /** How many processes. */
  count: number;
  /**
   * The worker's entry file. It must start a server on an ephemeral port and print one line
   * `READY <port>` on stdout. It reads `WORKER_INDEX` (0-based) and anything else from its env.
   */
  script: string;
  /** Extra environment for every worker, or per worker. */
  env?: Record<string, string> | ((index: number) => Record<string, string>) | undefined;
  /** Node flags, e.g. `['--import', 'tsx']` for a TypeScript worker. Default `['--import', 'tsx']`. */
  execArgv?: string[] | undefined;
  /** Longest wait for a worker's READY line. Default 20 s. */
  readyTimeoutMs?: number | undefined;
}

/** One worker process. */
export interface Worker {
  readonly index: number;
  readonly url: string;
  readonly process: ChildProcess;
  /** Everything the worker wrote to stdout and stderr so far, for assertions and failure messages. */
  readonly output: string;
  /** Resolves with the exit code or signal once the process has exited. */
  readonly exited: Promise<number | NodeJS.Signals | null>;
}

/** The running group of workers. */
export interface Workers {
  readonly workers: readonly Worker[];
  /** Sends `signal` (default SIGKILL: no cleanup, like a crash or an OOM kill) to worker `index`. */
  kill(index: number, signal?: NodeJS.Signals): Promise<void>;
  /** Starts worker `index` again (after a kill), with the same options. */
  restart(index: number): Promise<Worker>;
  /** Kills every worker and waits for them. */
  close(): Promise<void>;
}

/**
 * Starts N processes of a real server for fault tests: several workers share one real store, and a
 * test can SIGKILL any of them at a point the worker script chooses (for instance, a worker told
 * `KILL_AT=after-write` kills itself after its handler's write and before completion).
 *
 * @example
 * const group = await startWorkers({ count: 4, script: 'test/fixtures/charge-server.ts', env: { REDIS_URL } });
 * await fetch(`${group.workers[0]!.url}/charges`, { method: 'POST', headers: { 'idempotency-key': 'k' } });
 * await group.close();
 */
export async function startWorkers(options: WorkersOptions): Promise<Workers> {
  if (!Number.isInteger(options.count) || options.count < 1) throw new TypeError('count must be a positive integer');
  const workers: Worker[] = [];

  const launch = (index: number): Promise<Worker> => {
    const extra = typeof options.env === 'function' ? options.env(index) : (options.env ?? {});
    const child = spawn(process.execPath, [...(options.execArgv ?? ['--import', 'tsx']), options.script], {
      env: { ...process.env, ...extra, WORKER_INDEX: String(index) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    const exited = new Promise<number | NodeJS.Signals | null>((resolve) => {
      child.once('exit', (code, signal) => resolve(signal ?? code));
    });
    return new Promise<Worker>((resolve, reject) => {
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`worker ${index} was not ready in time:\n${output}`));
      }, options.readyTimeoutMs ?? 20_000);
      const onData = (chunk: Buffer) => {
        output += chunk.toString();
        const ready = /READY (\d+)/.exec(output);
        if (!ready) return;
        clearTimeout(timer);
        const worker: Worker = {
          index,
          url: `http://127.0.0.1:${ready[1]}`,
          process: child,
          get output() {
            return output;
          },
          exited,
        };
        resolve(worker);
      };
      child.stdout?.on('data', onData);
      child.stderr?.on('data', (chunk: Buffer) => {
        output += chunk.toString();
      });
      void exited.then((status) => {
        clearTimeout(timer);
        reject(new Error(`worker ${index} exited (${status}) before it was ready:\n${output}`));
      });
    });
  };

  try {
    workers.push(...(await Promise.all(Array.from({ length: options.count }, (_, i) => launch(i)))));
  } catch (error) {
    for (const worker of workers) worker.process.kill('SIGKILL');
    throw error;
  }

  const kill = async (index: number, signal: NodeJS.Signals = 'SIGKILL') => {
    const worker = workers[index];
    if (!worker) throw new RangeError(`no worker ${index}`);
    if (worker.process.exitCode === null && worker.process.signalCode === null) worker.process.kill(signal);
    await worker.exited;
  };

  return {
    workers,
    kill,
    async restart(index) {
      await kill(index);
      const worker = await launch(index);
      workers[index] = worker;
      return worker;
    },
    async close() {
      await Promise.all(workers.map((_, i) => kill(i)));
    },
  };
}
