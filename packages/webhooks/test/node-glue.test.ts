import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { gzipSync } from 'node:zlib';
import { memoryStore } from '@idem/core';
import { afterEach, describe, expect, it } from 'vitest';
import {
  createReceiver,
  createSigner,
  expressWebhook,
  type Receiver,
  readRawBody,
  WebhookError,
} from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const payload = Buffer.from('{"type":"payment.succeeded","data":{"amount":4200}}');

const closers: Array<() => void> = [];
afterEach(() => {
  for (const close of closers.splice(0)) close();
});

/**
 * A plain node:http server whose listener runs `handler`, as node:http does: the promise it returns
 * is not awaited by anybody. Resolves with the port and the first request's run once it starts.
 */
async function serve(handler: (req: IncomingMessage, res: ServerResponse) => Promise<void>) {
  // The run travels in an object: a promise resolved with a promise would wait for it to settle.
  let started: (first: { run: Promise<void> }) => void = () => undefined;
  const firstRun = new Promise<{ run: Promise<void> }>((resolve) => {
    started = resolve;
  });
  const server = createServer((req, res) => {
    const run = handler(req, res);
    run.catch(() => undefined); // read through firstRun
    started({ run });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  closers.push(() => {
    server.closeAllConnections();
    server.close();
  });
  return { port: (server.address() as AddressInfo).port, firstRun };
}

/** Sends the head and part of a declared body, then hangs up once the server is reading it. */
async function hangUpMidBody(target: Awaited<ReturnType<typeof serve>>, partial: Buffer, declared: number, extra = {}) {
  const socket = connect(target.port, '127.0.0.1');
  await once(socket, 'connect');
  const headers = { ...signer.sign({ id: 'evt_cut', body: payload, timestamp: new Date() }), ...extra };
  socket.write(
    [
      'POST /hooks HTTP/1.1',
      'Host: 127.0.0.1',
      'Content-Type: application/json',
      `Content-Length: ${declared}`,
      ...Object.entries(headers).map(([name, value]) => `${name}: ${value}`),
      '',
      '',
    ].join('\r\n'),
  );
  socket.write(partial);
  const first = await target.firstRun;
  socket.destroy();
  return first;
}

function receiver() {
  return createReceiver({ store: memoryStore(), secret: SECRET, apply: () => undefined });
}

describe('expressWebhook on a plain node:http server (no next)', () => {
  it('settles quietly when the sender hangs up mid-body, instead of rejecting with "next is not a function"', async () => {
    const target = await serve(expressWebhook(receiver()) as never);
    const { run } = await hangUpMidBody(target, payload.subarray(0, 10), payload.length);
    // Nobody awaits this promise in a real server: a rejection would be unhandled and end Node.
    await expect(run).resolves.toBeUndefined();
  });

  it('ends with a bare 500 when the receiver throws and the sender is still there, and settles', async () => {
    // A receiver that fails outright (a bug, a store that throws past the receiver): an error that
    // is no WebhookError, so the glue has no answer of its own and, without next, nobody to pass it to.
    const broken = {
      handle: () => {
        throw new Error('receiver bug');
      },
    } as unknown as Receiver;
    const target = await serve(expressWebhook(broken) as never);
    const headers = signer.sign({ id: 'evt_broken', body: payload, timestamp: new Date() });
    const response = await fetch(`http://127.0.0.1:${target.port}/hooks`, {
      method: 'POST',
      headers: { ...headers, 'content-type': 'application/json' },
      body: payload,
    });
    expect(response.status).toBe(500);
    expect(await response.text()).toBe('');
    // Nobody awaits this promise in a real server: a rejection would be unhandled and end Node.
    const { run } = await target.firstRun;
    await expect(run).resolves.toBeUndefined();
  });
});

describe('readRawBody with a Content-Encoding', () => {
  it('ends the read when a gzip body is cut off, instead of waiting for the rest forever', async () => {
    const glue = expressWebhook(receiver());
    const errors: unknown[] = [];
    const target = await serve((req, res) => glue(req, res, (error) => void errors.push(error)));
    const compressed = gzipSync(payload);
    const { run } = await hangUpMidBody(target, compressed.subarray(0, 12), compressed.length, {
      'Content-Encoding': 'gzip',
    });
    // Before, pipe() never told the decoder: the handler, its zlib stream and the request stayed
    // held for good (this test then ran into its timeout).
    await expect(run).resolves.toBeUndefined();
    // Answered by the glue as body_incomplete (see "a body cut short"), not passed to next.
    expect(errors).toEqual([]);
  }, 5_000);
});

describe('a body cut short', () => {
  // A sender that hangs up mid-body gives the request stream Node's `aborted` error, code
  // ECONNRESET: the very code a lost database connection carries. Passed on as it is, an app's error
  // handler that answers database failures 503 (and counts them) read a sender's hang-up as its
  // database going down. The glue answers it itself, as the WebhookError it is.
  it.each([
    ['identity', {}],
    ['gzip', { 'Content-Encoding': 'gzip' }],
  ])('is body_incomplete (400, retryable) from readRawBody, never the connection error (%s)', async (_name, extra) => {
    const seen: unknown[] = [];
    const target = await serve(async (req) => {
      try {
        await readRawBody(req);
      } catch (error) {
        seen.push(error);
      }
    });
    const body = 'Content-Encoding' in extra ? gzipSync(payload) : payload;
    const { run } = await hangUpMidBody(target, body.subarray(0, 12), body.length, extra);
    await run;
    expect(seen).toHaveLength(1);
    expect(seen[0]).toBeInstanceOf(WebhookError);
    expect(seen[0]).toMatchObject({ code: 'body_incomplete', status: 400 });
    expect((seen[0] as WebhookError).toProblem()).toMatchObject({ retryable: true });
  });

  it('is answered by the Express glue itself: next never sees it', async () => {
    const glue = expressWebhook(receiver());
    const errors: unknown[] = [];
    const target = await serve((req, res) => glue(req, res, (error) => void errors.push(error)));
    const { run } = await hangUpMidBody(target, payload.subarray(0, 10), payload.length);
    await expect(run).resolves.toBeUndefined();
    expect(errors).toEqual([]);
  });
});
