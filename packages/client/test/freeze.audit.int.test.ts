// Audit: @idem/client in a process frozen (SIGSTOP: a Lambda freeze between invocations, `docker
// pause`, a closed laptop lid on a VM, a long GC pause) and thawed (SIGCONT). The client runs in its
// own process (fixtures/freeze-client.ts); the server is a real HTTP server in this process, which
// freezes the client at the moment the test names.
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const script = fileURLToPath(new URL('./fixtures/freeze-client.ts', import.meta.url));
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function until<T>(probe: () => T, what: string, limitMs = 20_000): Promise<NonNullable<T>> {
  const started = performance.now();
  for (;;) {
    const value = probe();
    if (value) return value as NonNullable<T>;
    if (performance.now() - started > limitMs) throw new Error(`timed out waiting for ${what}`);
    await pause(10);
  }
}

/** The process state letter of /proc/<pid>/stat: 'T' when stopped. */
function stopped(pid: number): boolean {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) === 'T';
}

interface Child {
  process: ChildProcess;
  lines: Record<string, unknown>[];
  line(kind: string): Promise<Record<string, unknown>>;
}

function start(env: Record<string, string>): Child {
  const child = spawn(process.execPath, ['--import', 'tsx', script], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const lines: Record<string, unknown>[] = [];
  let buffered = '';
  child.stdout?.on('data', (chunk: Buffer) => {
    buffered += chunk.toString();
    let end = buffered.indexOf('\n');
    while (end >= 0) {
      lines.push(JSON.parse(buffered.slice(0, end)) as Record<string, unknown>);
      buffered = buffered.slice(end + 1);
      end = buffered.indexOf('\n');
    }
  });
  return {
    process: child,
    lines,
    line: (kind) => until(() => lines.find((line) => line.kind === kind), `the client's ${kind} line`),
  };
}

// A stopped process is told by its state in /proc (Linux): elsewhere this file is skipped.
describe.runIf(existsSync('/proc/self/stat'))('@idem/client frozen and thawed', () => {
  let server: Server;
  let baseUrl: string;
  let handle: (request: IncomingMessage, response: ServerResponse, n: number) => void = (_q, response) =>
    response.end();
  let requests = 0;
  let child: Child | undefined;

  beforeAll(async () => {
    server = createServer((request, response) => {
      request.resume();
      request.on('end', () => handle(request, response, ++requests));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterEach(async () => {
    // Never leave a stopped process behind.
    const process = child?.process;
    child = undefined;
    requests = 0;
    if (process && process.exitCode === null && process.signalCode === null) {
      const exited = new Promise((resolve) => process.once('exit', resolve));
      process.kill('SIGCONT');
      process.kill('SIGKILL');
      await exited;
    }
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  it('performance.now() (CLOCK_MONOTONIC) includes the time a process was stopped: a freeze counts against every interval the client and idem time on it', async () => {
    child = start({ CLOCK: '1' });
    await child.line('stopping');
    const pid = child.process.pid as number;
    await until(() => stopped(pid), 'the child to stop');
    const frozenAt = performance.now();
    // The length of the freeze is the test's choice, not a TTL waited out.
    await pause(800);
    const frozenFor = performance.now() - frozenAt;
    child.process.kill('SIGCONT');
    const clock = await child.line('clock');
    expect(clock.monotonicMs as number).toBeGreaterThanOrEqual(frozenFor - 5);
  });

  it('frozen while its backoff runs past its deadline: on thaw it ends with deadline_exceeded and sends no further attempt', async () => {
    // The first attempt gets 503; the client waits 1 s (the baseDelay ceiling: no jitter) before the next.
    handle = (_request, response) => response.writeHead(503).end();
    child = start({ BASE_URL: baseUrl, DEADLINE_MS: '1500', BASE_DELAY_MS: '1000', MAX_ATTEMPTS: '5' });
    const pid = child.process.pid as number;
    await until(() => requests === 1, 'the first attempt');
    // Frozen in its wait (the client says when it begins one), well past the deadline.
    await child.line('retrying');
    child.process.kill('SIGSTOP');
    await until(() => stopped(pid), 'the client to stop');
    await pause(2_000);
    child.process.kill('SIGCONT');
    const result = await child.line('result');
    expect(result).toMatchObject({ ok: false, code: 'deadline_exceeded' });
    expect(requests).toBe(1);
  });

  it('frozen with an attempt in flight whose answer came during the freeze: the answer counts, it is no timeout and no retry', async () => {
    // The server answers 201 at once, after freezing the client: the answer waits in its socket.
    handle = (_request, response) => {
      child?.process.kill('SIGSTOP');
      response.writeHead(201, { 'content-type': 'application/json' }).end('{"id":"ch_1"}');
    };
    child = start({ BASE_URL: baseUrl, ATTEMPT_TIMEOUT_MS: '300', MAX_ATTEMPTS: '1' });
    const pid = child.process.pid as number;
    await until(() => requests === 1, 'the attempt');
    await until(() => stopped(pid), 'the client to stop');
    // Frozen past the attempt's timeout.
    await pause(1_000);
    child.process.kill('SIGCONT');
    const result = await child.line('result');
    // Was wrong: the attempt's timeout timer ran before the answer waiting in the socket was read, so
    // an operation the server had carried out failed with `timeout` (or, with retries left, was sent
    // again: a replay at best, with a key the server no longer keeps a second execution).
    expect(result).toMatchObject({ ok: true, status: 201, retries: 0 });
    expect(requests).toBe(1);
  });
});
