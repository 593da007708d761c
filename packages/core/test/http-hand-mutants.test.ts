// The HTTP layer's decisions a hand mutation pass of packages/core/src/http-*.ts found no test held:
// each test fails with the mutant named above it and passes without it.
import { createServer, IncomingMessage, ServerResponse } from 'node:http';
import { type AddressInfo, Socket } from 'node:net';
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { readBodyForFingerprint, readStream } from '../src/http-body.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import type { HttpRequestInfo } from '../src/http-types.js';
import { memoryStore } from '../src/memory-store.js';
import { serve } from './capture-server.js';

const charge = (overrides: Partial<HttpRequestInfo> = {}): HttpRequestInfo => ({
  method: 'POST',
  route: '/charges',
  path: '/charges',
  query: '',
  contentType: 'application/octet-stream',
  keyHeader: 'k-1',
  body: undefined,
  scope: 'caller',
  ...overrides,
});

describe('begin: the body limit on a body the adapter already holds', () => {
  // Mutant: `body.length > maxBodyBytes` made `>=`. The readers' own limits are tested at the edge
  // (http-edges.test.ts), but a body handed to begin() as bytes (a parser's rawBody) meets this
  // check alone: at the limit it is taken, one byte more is 413.
  it('takes a body of exactly maxBodyBytes and refuses one byte more with 413 body_too_large', async () => {
    const http = createHttpIdempotency({ store: memoryStore(), maxBodyBytes: 8 });
    const atLimit = await http.begin(charge({ keyHeader: 'at', body: Buffer.alloc(8, 1) }));
    expect(atLimit.kind).toBe('execute');
    const over = await http.begin(charge({ keyHeader: 'over', body: Buffer.alloc(9, 1) }));
    expect(over.kind === 'respond' && over.response.status).toBe(413);
  });
});

describe('capture.completeWith: the response cap at its edge', () => {
  // Mutant: `response.body.byteLength > state.maxBytes` made `>=`. A response the adapter hands over
  // whole (Koa's ctx.body, Fastify's payload) is held to maxResponseBytes as a written one is: a body
  // of exactly the cap is stored, one byte more is too large to replay.
  it('stores a body of exactly maxResponseBytes, and settles one byte more as too large', async () => {
    const http = createHttpIdempotency({ store: memoryStore(), maxResponseBytes: 4 });
    const outcome = async (size: number) => {
      const capture = http.capture(new ServerResponse(new IncomingMessage(new Socket())));
      capture.completeWith({ status: 201, headers: {}, body: Buffer.alloc(size, 1) });
      const result = await capture.result;
      return result.kind === 'complete' ? result.kind : result.reason;
    };
    expect(await outcome(4)).toBe('complete');
    expect(await outcome(5)).toBe('too-large');
  });
});

describe('readStream: a stream that ends with its upload cut short', () => {
  // Mutant: endOfBody's `aborted === true` check gone. Some runtimes end an HTTP/2 request's
  // readable side normally when its client resets the stream mid-upload (no 'error', as an HTTP/1.1
  // request gives), with only `aborted` to say so: the bytes so far must not be taken for the body,
  // or the key is claimed with the wrong fingerprint and the client's whole retry gets 422.
  it('takes a stream that ends with `aborted` set for an incomplete body (400), and one without it whole', async () => {
    const cut = new PassThrough();
    const reading = readStream(cut, 1024);
    cut.write('amount=1');
    (cut as PassThrough & { aborted?: boolean }).aborted = true;
    cut.end();
    const read = await reading;
    expect(read.ok ? 'read' : read.error.code).toBe('body_incomplete');
    const whole = new PassThrough();
    const readingWhole = readStream(whole, 1024);
    whole.end('amount=100');
    expect(await readingWhole).toEqual({ ok: true, body: Buffer.from('amount=100') });
  });
});

describe('the declared length of a captured response', () => {
  // Mutant: a Content-Length set as a one-item list (`setHeader('content-length', ['4'])`, which Node
  // sends as that one field) read as no length. Its last declared byte then settles nothing: a
  // handler that never calls end() (the client has every byte) left its key in progress, and the
  // retry got 409 instead of the replay.
  it('reads a Content-Length given as a one-item list: the last declared byte settles the outcome', async () => {
    const served = await serve({
      answer: (res) => {
        res.statusCode = 201;
        res.setHeader('content-length', ['4']);
        res.write('paid');
      },
    });
    try {
      const first = await served.post('k');
      expect([first.status, first.body.toString()]).toEqual([201, 'paid']);
      const again = await served.post('k');
      expect([again.status, again.headers['idempotent-replayed'], again.body.toString()]).toEqual([
        201,
        'true',
        'paid',
      ]);
      expect(served.runs()).toBe(1);
    } finally {
      await served.close();
    }
  });
});

describe('a response written past its declared length', () => {
  // Mutant: asFramed's cut gone. A handler that writes more than its Content-Length declares sends
  // its client only the declared bytes (HTTP framing; Node passes the rest on, and the client drops
  // it): the replay must give the same bytes, not the longer body the handler wrote.
  it('stores the declared bytes only, so the replay is what the first client read', async () => {
    const served = await serve({
      answer: (res) => {
        res.statusCode = 201;
        res.setHeader('content-length', '4');
        res.end('paid and more');
      },
    });
    try {
      // Node's client takes the declared bytes, then refuses what follows on the connection.
      await served.post('k').catch(() => undefined);
      const again = await served.post('k');
      expect([again.status, again.headers['idempotent-replayed'], again.body.toString()]).toEqual([
        201,
        'true',
        'paid',
      ]);
      expect(served.runs()).toBe(1);
    } finally {
      await served.close();
    }
  });
});

describe('a held head', () => {
  // Mutant: the held head's status mirrored only up to 599. Node's writeHead takes 100 to 999 and
  // sets `statusCode`; held, the head waits for the transaction, and what reads the status before
  // the flush (an adapter's `unrouted`) must see the one written, over the whole range Node takes.
  it("sets the response's statusCode at once, for every status Node's writeHead takes", () => {
    const http = createHttpIdempotency({ store: memoryStore() });
    for (const status of [100, 201, 599, 600, 999]) {
      const res = new ServerResponse(new IncomingMessage(new Socket()));
      http.capture(res, { hold: true });
      res.writeHead(status);
      expect(res.statusCode, String(status)).toBe(status);
      expect(res.headersSent).toBe(false);
    }
  });
});

describe('readBodyForFingerprint after a parser that stopped at the last byte', () => {
  // Mutant: readRequestBody's `req.complete && req.readableLength === 0` case gone. A parser that
  // reads the body with read() and parses it once the last byte is in has it all, while 'end' is
  // still a tick away (`readableEnded` false). Taken for a body nobody read, the request was read
  // again, gave no bytes, and the empty body was fingerprinted instead of the parsed one: two
  // different bodies under one key were one request.
  it('takes the parsed body, not an empty read, when the body was read whole before its end', async () => {
    const seen: unknown[] = [];
    const server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('readable', function parse() {
        for (let chunk = req.read(); chunk !== null; chunk = req.read()) chunks.push(chunk);
        if (!req.complete) return;
        req.off('readable', parse);
        seen.push([req.readableEnded, req.readableLength]);
        const parsed: unknown = JSON.parse(Buffer.concat(chunks).toString());
        void readBodyForFingerprint(req, 1_024, { body: parsed }).then((read) => {
          seen.push(read);
          res.end();
        });
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const { port } = server.address() as AddressInfo;
      await (await fetch(`http://127.0.0.1:${port}/`, { method: 'POST', body: '{"amount":1}' })).text();
    } finally {
      server.close();
    }
    expect(seen).toEqual([[false, 0], { ok: true, body: undefined, json: { amount: 1 } }]);
  });
});
