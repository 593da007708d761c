// Audit: store deadlines across an event-loop stall (a process frozen by SIGSTOP, `docker pause` or a
// Lambda freeze; a long GC pause). On resume, libuv runs overdue timers before it reads any socket:
// a call whose answer arrived during the stall must not be failed for the stall.
import { type ChildProcess, spawn } from 'node:child_process';
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDeadlines } from '../src/deadlines.js';

// The "store": an echo server in another process, so that it answers while this one is stalled.
let server: ChildProcess;
let port: number;
beforeAll(async () => {
  server = spawn(
    process.execPath,
    [
      '-e',
      "require('node:net').createServer((s) => { s.on('error', () => {}); s.pipe(s) }).listen(0, '127.0.0.1', function () { console.log(this.address().port) })",
    ],
    { stdio: ['ignore', 'pipe', 'ignore'] },
  );
  port = await new Promise<number>((resolve) => server.stdout?.once('data', (chunk: Buffer) => resolve(Number(chunk))));
});
afterAll(() => {
  server?.kill('SIGKILL');
});

const spin = (ms: number) => {
  const until = performance.now() + ms;
  while (performance.now() < until) {}
};

describe('createDeadlines across a stall', () => {
  it('a call answered while the event loop was stalled past the limit resolves with its answer', async () => {
    const socket: Socket = connect(port, '127.0.0.1');
    socket.on('error', () => undefined);
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
    try {
      const withDeadline = createDeadlines(100);
      // Give the sweeper its interval first, so that it is due while the loop is stalled.
      void withDeadline('get', () => Promise.resolve('warm'));
      const answer = withDeadline(
        'get',
        () => new Promise<string>((resolve) => socket.once('data', (chunk) => resolve(chunk.toString()))),
      );
      socket.write('pong');
      // The stall: the echo arrives in the socket's buffer, unread, and the deadline passes.
      spin(400);
      await expect(answer).resolves.toBe('pong');
    } finally {
      socket.destroy();
    }
  });

  it('a call with no answer still fails after the stall', async () => {
    const withDeadline = createDeadlines(100);
    const answer = withDeadline('get', () => new Promise<never>(() => undefined));
    spin(400);
    await expect(answer).rejects.toThrow('store get timed out after 100ms');
  });
});
