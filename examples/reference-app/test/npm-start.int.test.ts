// `npm start` under a supervisor: SIGTERM sent to one process only, as systemd, a container runtime or
// `kill <pid>` do, either to `npm start` or to the script it runs (examples/reference-app/start.mjs). The app must stop
// cleanly (its ports closed; exit status 0 when signalled itself), not be left running as an orphan
// that holds its ports.
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readdir } from 'node:fs/promises';
import { connect } from 'node:net';
import { describe, expect, it, vi } from 'vitest';
import { startScript } from './start-script.js';

function refuses(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', () => resolve(true));
  });
}

const { spawnApp } = startScript('idem-start-');

/** Starts `command` from the repository root on free ports and an empty PGlite folder; resolves once it is up. */
async function startApp(
  command: string,
  args: string[],
): Promise<{ child: ChildProcess; ports: number[]; output: () => string; dir: string }> {
  const { child: started, ports, dir } = await spawnApp(command, args);
  let output = '';
  await new Promise<void>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes('Ctrl-C stops everything.')) resolve();
    };
    started.stdout?.on('data', onData);
    started.stderr?.on('data', onData);
    started.once('exit', () => reject(new Error(`${command} exited early:\n${output}`)));
  });
  return { child: started, ports, output: () => output, dir };
}

function exitOf(child: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
}

/** Resolves once every port refuses connections; the test's timeout says when that never happens. */
async function closed(ports: number[]): Promise<void> {
  for (const port of ports) {
    while (!(await refuses(port))) await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe('npm start (examples/reference-app/start.mjs)', () => {
  it('stops on SIGTERM to the script: a request already running is answered, then the ports close and it exits 0', async () => {
    const app = await startApp(process.execPath, ['examples/reference-app/start.mjs']);
    const exited = exitOf(app.child);
    expect(await refuses(app.ports[2] as number)).toBe(false);
    // A webhook delivery to the receiver, half sent when the signal comes: the receiver reads the
    // whole body before anything else, so the request is running and unanswered.
    const socket = connect({ host: '127.0.0.1', port: app.ports[4] as number });
    await once(socket, 'connect');
    let answer = '';
    socket.on('data', (chunk: Buffer) => {
      answer += chunk.toString();
    });
    socket.on('error', () => undefined);
    const ended = once(socket, 'close');
    const body = '{"type":"payment.succeeded"}';
    socket.write(
      'POST /webhooks/payments HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n' +
        `Content-Length: ${body.length}\r\nwebhook-id: msg_drain\r\nwebhook-timestamp: 1\r\n` +
        `webhook-signature: v1,${Buffer.alloc(32).toString('base64')}\r\n\r\n${body.slice(0, 5)}`,
    );
    process.kill(app.child.pid as number, 'SIGTERM');
    await vi.waitFor(() => expect(app.output()).toContain('SIGTERM: stopping'));
    expect(answer).toBe('');
    socket.write(body.slice(5));
    await ended;
    // Answered (the signature is refused), not cut: the shutdown waited for it.
    expect(answer).toMatch(/^HTTP\/1\.1 4\d\d /);
    expect(await exited).toEqual({ code: 0, signal: null });
    for (const port of app.ports) expect(await refuses(port)).toBe(true);
  }, 60_000);

  it('a second signal a second or more after the first exits at once, without waiting for a request that will not end', async () => {
    const app = await startApp(process.execPath, ['examples/reference-app/start.mjs']);
    const exited = exitOf(app.child);
    // A webhook delivery half sent and never finished: the drain would wait its whole grace (10 s).
    const socket = connect({ host: '127.0.0.1', port: app.ports[4] as number });
    await once(socket, 'connect');
    socket.on('error', () => undefined);
    // `Expect: 100-continue` makes the server say when it has read the head: a request it has not
    // read yet would count as an idle connection, closed at once by the drain (a flaky pass).
    socket.write(
      'POST /webhooks/payments HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n',
    );
    const [interim] = (await once(socket, 'data')) as [Buffer];
    expect(interim.toString('latin1')).toMatch(/^HTTP\/1\.1 100 /);
    socket.write('{');
    process.kill(app.child.pid as number, 'SIGTERM');
    await vi.waitFor(() => expect(app.output()).toContain('SIGTERM: stopping'));
    // The copy a terminal's Ctrl-C sends through npm arrives at once: it is not a second request.
    process.kill(app.child.pid as number, 'SIGTERM');
    await new Promise((resolve) => setTimeout(resolve, 1_200));
    expect(app.child.exitCode).toBeNull();
    const asked = performance.now();
    process.kill(app.child.pid as number, 'SIGTERM');
    expect(await exited).toEqual({ code: 143, signal: null });
    expect(performance.now() - asked).toBeLessThan(3_000);
    expect(app.output()).toContain('SIGTERM again: exiting now');
    socket.destroy();
  }, 60_000);

  // Mutation pass: kills dropping SIGHUP from the handled signals, and DATA_DIR being ignored.
  it('stops on SIGHUP (a closed terminal) as on SIGTERM, and keeps its data in DATA_DIR', async () => {
    const app = await startApp(process.execPath, ['examples/reference-app/start.mjs']);
    const exited = exitOf(app.child);
    expect((await readdir(app.dir)).length).toBeGreaterThan(0);
    process.kill(app.child.pid as number, 'SIGHUP');
    expect(await exited).toEqual({ code: 0, signal: null });
    expect(app.output()).toContain('SIGHUP: stopping');
  }, 60_000);

  it('stops when `npm start` itself gets SIGTERM (npm signals its shell, which dies without passing it on)', async () => {
    const app = await startApp('npm', ['start']);
    process.kill(app.child.pid as number, 'SIGTERM');
    await exitOf(app.child);
    await closed(app.ports);
  }, 60_000);
});
