// Every server (and every in-process loop such as raw jose) runs in a child process of its own, so
// the load generator in the runner and the code under test each get one of the two cores instead of
// sharing one event loop. Children run on plain Node with the built packages, as a user's server
// does; only the reference app, whose sources are TypeScript, runs under tsx (with the runner's
// TSX_TSCONFIG_PATH, so its `@idem/*` imports are the built packages as well).
import { fork } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const benchmarks = dirname(dirname(fileURLToPath(import.meta.url)));
const root = dirname(benchmarks);

/** How long a child may take to start before it counts as failed (a loaded box starts slowly). */
const startTimeoutMs = 60_000;

/**
 * Starts `benchmarks/servers/<entry>` with `spec` and resolves with the first IPC message it sends
 * (a server's `{ port }`, a loop's `{ opsPerSecond }`), a `stop()` that asks it to end and waits,
 * a `cpu()` that resolves with the CPU time the child has used so far, in µs over every thread
 * (`{ cpuMicros: user and system, systemMicros: system alone }`, from children that call
 * {@link answerCpuQueries}), and the child's `pid`. `cpu()` rejects when the child is gone or goes
 * before it answers. `options.execArgv` adds Node flags (`--cpu-prof`, say).
 * Rejects with the child's last stderr line when it exits or throws before answering.
 *
 * @example
 * const server = await startChild('serve.mjs', { kind: 'node-http' });
 * console.log(server.message.port, (await server.cpu()).cpuMicros);
 * await server.stop();
 */
export function startChild(entry, spec, options = {}) {
  const child = fork(join(benchmarks, 'servers', entry), [], {
    cwd: root,
    execArgv: [...(spec.kind === 'reference-app' ? ['--import', 'tsx'] : []), ...(options.execArgv ?? [])],
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
    env: { ...process.env, NODE_ENV: 'production' },
  });
  let stderr = '';
  child.stderr.on('data', (chunk) => {
    stderr = (stderr + chunk).slice(-4_000);
  });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  // The spec goes over IPC, not argv: a list of 2,000 tokens is past the kernel's limit for one argument.
  child.send({ spec }, () => {});
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.send('stop', () => {});
    // A child that does not clean up in time is killed: the next contender must not share the cores.
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  };
  const cpu = () =>
    new Promise((resolve, reject) => {
      // A child that is gone would never answer, and its 'exit' has fired already.
      if (child.exitCode !== null || child.signalCode !== null) {
        reject(new Error(`${entry} exited before it reported its CPU time`));
        return;
      }
      const onMessage = (message) => {
        if (message && typeof message === 'object' && 'cpuMicros' in message) {
          settle();
          resolve({ cpuMicros: message.cpuMicros, systemMicros: message.systemMicros });
        }
      };
      const onExit = () => {
        settle();
        reject(new Error(`${entry} exited before it reported its CPU time`));
      };
      const settle = () => {
        child.off('message', onMessage);
        child.off('exit', onExit);
      };
      child.on('message', onMessage);
      child.once('exit', onExit);
      child.send('cpu', (error) => {
        if (!error) return;
        settle();
        reject(new Error(`${entry} could not be asked for its CPU time: ${error.message}`));
      });
    });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${entry} did not start within ${startTimeoutMs / 1000} s`));
    }, startTimeoutMs);
    child.once('message', (message) => {
      clearTimeout(timer);
      if (message && typeof message === 'object' && 'error' in message) {
        stop().then(() => reject(new Error(String(message.error))));
        return;
      }
      resolve({ message, stop, cpu, pid: child.pid });
    });
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      const last = stderr.trim().split('\n').at(-1) ?? '';
      reject(new Error(`${entry} exited with ${code ?? signal}${last ? `: ${last}` : ''}`));
    });
  });
}

/**
 * For children: the spec the parent sent with {@link startChild}.
 *
 * @example
 * const spec = await receiveSpec();
 */
export function receiveSpec() {
  return new Promise((resolve) => {
    const listener = (message) => {
      if (message && typeof message === 'object' && 'spec' in message) {
        process.off('message', listener);
        resolve(message.spec);
      }
    };
    process.on('message', listener);
  });
}

/**
 * For children: waits for 'stop' from the parent, runs `cleanup`, and exits. Also cleans up and
 * exits when the parent disappears or a signal comes, so an interrupted run leaves nothing behind.
 *
 * @example
 * onStop(async () => server.close());
 */
export function onStop(cleanup, { graceMs = 10_000 } = {}) {
  let finishing = false;
  const finish = async (code) => {
    if (finishing) return;
    finishing = true;
    // A cleanup that hangs (a store whose server is already gone, retried by its client) must not
    // keep the process alive: it exits after the grace period whatever the cleanup is doing.
    setTimeout(() => process.exit(code), graceMs).unref();
    try {
      await cleanup();
    } finally {
      process.exit(code);
    }
  };
  process.on('message', (message) => {
    if (message === 'stop') finish(0);
  });
  process.on('disconnect', () => finish(0));
  // Ctrl-C reaches every process of the terminal's group, this one too: without a handler it would
  // die before deleting its keys, tables and schemas from the machine's shared services. A second
  // signal while cleaning up means "now": exit at once.
  const onSignal = (code) => () => (finishing ? process.exit(code) : finish(code));
  process.on('SIGINT', onSignal(130));
  process.on('SIGTERM', onSignal(143));
}

/**
 * For children: answers the parent's `cpu()` with the CPU time this process has used so far, so
 * the parent can tell what a window cost the server, whatever the load generator's own speed.
 *
 * @example
 * answerCpuQueries();
 */
export function answerCpuQueries() {
  process.on('message', (message) => {
    if (message !== 'cpu') return;
    const { user, system } = process.cpuUsage();
    process.send({ cpuMicros: user + system, systemMicros: system }, () => {});
  });
}

/**
 * For children: reports a start-up failure to the parent as a message instead of a stack trace.
 *
 * @example
 * main().catch(reportFailure);
 */
export function reportFailure(error) {
  const text = error instanceof Error ? error.message : String(error);
  if (process.send) process.send({ error: text }, () => process.exit(1));
  else {
    console.error(text);
    process.exit(1);
  }
}
