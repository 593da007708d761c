// Shutdown: a request already running when a service closes still gets its answer, its keep-alive
// connection does not hold the close for the keep-alive timeout, and a stuck one is cut at the grace.
import { Agent, type IncomingMessage, request } from 'node:http';
import { connect } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { type ListeningPort, listen } from '../src/listen.js';

const opened: ListeningPort[] = [];
afterEach(async () => {
  await Promise.all(opened.splice(0).map((port) => port.close(0)));
});

async function portWith(handler: Parameters<ListeningPort['use']>[0]): Promise<ListeningPort> {
  const port = await listen(0);
  port.use(handler);
  opened.push(port);
  return port;
}

function post(port: ListeningPort, agent: Agent): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port: port.port, method: 'POST', path: '/', agent },
      (res: IncomingMessage) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          body += chunk;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** True once `port` refuses a new connection: its close has begun (the listener is gone). */
function refuses(port: ListeningPort): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port.port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', (error: NodeJS.ErrnoException) => resolve(error.code === 'ECONNREFUSED'));
  });
}

/** A promise (`seen`) that the handler resolves (`arrived`) once the request has reached it. */
function arrival(): { seen: Promise<void>; arrived: () => void } {
  let arrived: () => void = () => undefined;
  const seen = new Promise<void>((resolve) => {
    arrived = resolve;
  });
  return { seen, arrived };
}

describe('closing a port (drainable)', () => {
  it('lets a running request finish and closes its keep-alive connection as soon as it is answered', async () => {
    const agent = new Agent({ keepAlive: true });
    const { seen, arrived } = arrival();
    let answer: () => void = () => undefined;
    const port = await portWith((_req, res) => {
      answer = () => res.end('done');
      arrived();
    });
    const running = post(port, agent);
    await seen;
    let closed = false;
    const closing = port.close().then(() => {
      closed = true;
    });
    // Closing (new connections refused), and still not closed while the request runs.
    await expect.poll(() => refuses(port)).toBe(true);
    expect(closed).toBe(false);
    answer();
    await expect(running).resolves.toEqual({ status: 200, body: 'done' });
    // Node alone keeps the answered connection for its 5 s keep-alive timeout; the test's 3 s would expire.
    await closing;
    agent.destroy();
  }, 3_000);

  it('cuts a request still running after the grace, so a stuck handler cannot hold the shutdown', async () => {
    const agent = new Agent({ keepAlive: true });
    const { seen, arrived } = arrival();
    const port = await portWith(() => arrived());
    const running = post(port, agent);
    await seen;
    await port.close(30);
    await expect(running).rejects.toThrow(/socket hang up|ECONNRESET/);
    agent.destroy();
  }, 3_000);

  it('refuses new connections once closing, and a second close is the same close', async () => {
    const port = await portWith((_req, res) => res.end('ok'));
    const first = port.close();
    expect(port.close()).toBe(first);
    await first;
    await expect(post(port, new Agent())).rejects.toThrow(/ECONNREFUSED/);
  });
});

describe('closing a port with a pipelined request behind a running one', () => {
  it('answers a request the handler ends at once without throwing from the drain', async () => {
    // A client may pipeline: Node emits the second request while the first still runs. Once the
    // close began, the drain marks each new response `Connection: close`; a handler that answered
    // synchronously (the "Starting up" 503, a target that does not parse) had sent its head already,
    // and setHeader threw ERR_HTTP_HEADERS_SENT out of the server's 'request' event: an uncaught
    // exception, which ends the process in the middle of its graceful shutdown.
    let hold: () => void = () => undefined;
    const { seen, arrived } = arrival();
    const fast = arrival();
    const port = await portWith((req, res) => {
      if (req.url === '/slow') {
        hold = () => res.end('slow');
        arrived();
        return;
      }
      res.end('fast');
      fast.arrived();
    });
    // What the 'request' listeners throw, caught here instead of reaching the process.
    const thrown: unknown[] = [];
    const emit = port.server.emit.bind(port.server);
    port.server.emit = ((event: string, ...args: unknown[]) => {
      try {
        return emit(event, ...args);
      } catch (error) {
        thrown.push(error);
        return true;
      }
    }) as typeof port.server.emit;
    const socket = connect(port.port, '127.0.0.1');
    let received = '';
    socket.setEncoding('utf8').on('data', (chunk: string) => {
      received += chunk;
    });
    const ended = new Promise((resolve) => socket.once('close', resolve));
    socket.write('GET /slow HTTP/1.1\r\nHost: x\r\n\r\n');
    await seen;
    const closing = port.close();
    socket.write('GET /fast HTTP/1.1\r\nHost: x\r\n\r\n');
    await fast.seen;
    hold();
    await closing;
    await ended;
    expect(thrown).toEqual([]);
    expect(received).toMatch(/^HTTP\/1\.1 200 OK\r\n[\s\S]*\r\n\r\nslow/);
  }, 3_000);
});
