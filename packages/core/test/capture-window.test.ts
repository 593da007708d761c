// The response capture's edges (packages/core/src/http-capture.ts), each against a real server: what the
// first client read is what the record keeps and what a replay sends.
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import http2 from 'node:http2';
import type { AddressInfo, Socket } from 'node:net';
import { connect } from 'node:net';
import { describe, expect, it } from 'vitest';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import { writeResponse } from '../src/http-write.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';
import { networkLike, serve } from './capture-server.js';

describe('a phrase set between end() and the deferred end (store answering a few turns later)', () => {
  it('the first client reads the phrase stored and replayed', async () => {
    const served = await serve({
      store: networkLike(),
      answer: (res) => {
        res.statusCode = 201;
        res.statusMessage = 'Created Fine';
        res.end('{"id":"ch_1"}');
        // The head has not left: the capture holds the end until the outcome is stored.
        res.statusMessage = 'Set After End';
      },
    });
    try {
      const first = await served.post('k-1');
      const again = await served.post('k-1');
      expect(again.headers['idempotent-replayed']).toBe('true');
      // A plain Node response ignores a phrase set after end(): its head was written at end().
      expect(first.statusMessage).toBe('Created Fine');
      expect([again.status, again.statusMessage]).toEqual([first.status, first.statusMessage]);
    } finally {
      await served.close();
    }
  });

  it('a status set after end() does not go out either', async () => {
    const served = await serve({
      store: networkLike(),
      answer: (res) => {
        res.statusCode = 201;
        res.end('{"id":"ch_1"}');
        res.statusCode = 500;
      },
    });
    try {
      const first = await served.post('k-1');
      const again = await served.post('k-1');
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect([first.status, first.statusMessage]).toEqual([201, 'Created']);
      expect([again.status, again.statusMessage]).toEqual([201, 'Created']);
    } finally {
      await served.close();
    }
  });
});

describe('a header set, changed or removed between end() and the deferred end', () => {
  it('goes out as it was at end(), which the record keeps and the replay sends', async () => {
    const served = await serve({
      store: networkLike(),
      answer: (res) => {
        res.statusCode = 201;
        res.setHeader('content-type', 'application/json');
        res.setHeader('etag', '"v1"');
        res.setHeader('link', '</a>; rel=x');
        res.end('{"id":"ch_1"}');
        // The head has not left yet; on a plain response each of these would throw
        // ERR_HTTP_HEADERS_SENT (the head was written at end()).
        res.setHeader('location', '/late');
        res.setHeader('etag', '"v2"');
        res.removeHeader('link');
      },
    });
    try {
      const first = await served.post('k-1');
      const again = await served.post('k-1');
      expect(again.headers['idempotent-replayed']).toBe('true');
      for (const received of [first, again]) {
        expect(received.headers.location).toBeUndefined();
        expect(received.headers.etag).toBe('"v1"');
        expect(received.headers.link).toBe('</a>; rel=x');
      }
    } finally {
      await served.close();
    }
  });
});

describe('a write, end or writeHead between end() and the deferred end', () => {
  it('is taken as after the end, as Node takes it: the first client reads what the record keeps', async () => {
    const seen: unknown[] = [];
    const served = await serve({
      store: networkLike(),
      answer: (res) => {
        res.statusCode = 201;
        res.on('error', (error: NodeJS.ErrnoException) => seen.push(error.code));
        res.end('a');
        res.write('b', (error?: NodeJS.ErrnoException | null) => seen.push(`write: ${error?.code}`));
        res.end('c');
        try {
          res.writeHead(500, { location: '/late' });
        } catch (error) {
          seen.push(`writeHead: ${(error as NodeJS.ErrnoException).code}`);
        }
      },
    });
    try {
      const first = await served.post('k-1');
      const again = await served.post('k-1');
      expect(again.headers['idempotent-replayed']).toBe('true');
      for (const received of [first, again]) {
        expect([received.status, received.body.toString(), received.headers.location]).toEqual([201, 'a', undefined]);
      }
      expect(seen).toContain('writeHead: ERR_HTTP_HEADERS_SENT');
      await expect.poll(() => seen).toContain('write: ERR_STREAM_WRITE_AFTER_END');
    } finally {
      await served.close();
    }
  });
});

describe('a one-byte body framed by its Content-Length, its head held with its byte', () => {
  it('a status or header set after that byte was written goes out as it was at the write', async () => {
    const served = await serve({
      store: networkLike(),
      answer: (res) => {
        res.statusCode = 201;
        res.setHeader('content-length', '1');
        res.setHeader('etag', '"v1"');
        // The last declared byte: the response is whole, settled here, its byte held for the store.
        res.write('1');
        res.statusCode = 500;
        res.setHeader('etag', '"v2"');
        res.setHeader('location', '/late');
        res.end();
      },
    });
    try {
      const first = await served.post('k-1');
      const again = await served.post('k-1');
      expect(again.headers['idempotent-replayed']).toBe('true');
      for (const received of [first, again]) {
        expect([received.status, received.headers.etag, received.headers.location]).toEqual([201, '"v1"', undefined]);
        expect(received.body.toString()).toBe('1');
      }
    } finally {
      await served.close();
    }
  });
});

const listHeaders: [string, string[]][] = [
  ['link', ['<a>; rel=x', '<b>; rel=y']],
  ['vary', ['accept', 'accept-language']],
  ['content-language', ['en', 'fr']],
  ['x-trail', ['one', 'two']],
];

describe('a header set as a list', () => {
  // Several field lines of one name are one list-valued field (RFC 9110 section 5.3: a sender sends
  // them only for a list, and a recipient may join them with a comma). The record keeps a header as
  // one string, so the replay sends that value as one line: the same field, not the same bytes.
  // (Keeping the lines would change the record format, which the previous release's record check
  // refuses: a record written during a rolling upgrade would be a 503 there.)
  it.each(listHeaders)(
    '%s: the replay sends the values the first answer sent, joined in one line',
    async (name, values) => {
      const served = await serve({
        replayHeaders: ['x-trail'],
        answer: (res) => {
          res.statusCode = 201;
          res.setHeader(name, values);
          res.end('{}');
        },
      });
      try {
        const first = await served.post('k-1');
        const again = await served.post('k-1');
        expect(again.headers['idempotent-replayed']).toBe('true');
        const lines = (received: { raw: string[] }) =>
          received.raw.flatMap((field, i) =>
            i % 2 === 0 && field.toLowerCase() === name ? [received.raw[i + 1]] : [],
          );
        expect(lines(first)).toEqual(values);
        expect(lines(again)).toEqual([values.join(', ')]);
      } finally {
        await served.close();
      }
    },
  );
});

// A raw HTTP/1.1 POST that resolves once the head and `bytes` body bytes have arrived (a response
// that declares more than it sends never ends: its client would wait), or at the connection's end.
function rawPost(base: string, key: string, bytes: number): Promise<{ head: string; body: string }> {
  return new Promise((resolve, reject) => {
    const socket: Socket = connect(Number(new URL(base).port), '127.0.0.1');
    const chunks: Buffer[] = [];
    const read = () => {
      const all = Buffer.concat(chunks);
      const at = all.indexOf('\r\n\r\n');
      return at < 0
        ? undefined
        : { head: all.subarray(0, at).toString('latin1'), body: all.subarray(at + 4).toString() };
    };
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
      const got = read();
      if (got !== undefined && got.body.length >= bytes) {
        socket.destroy();
        resolve(got);
      }
    });
    socket.on('end', () => resolve(read() ?? { head: '', body: '' }));
    socket.on('error', reject);
    socket.write(`POST /charges HTTP/1.1\r\nhost: x\r\nidempotency-key: ${key}\r\ncontent-length: 0\r\n\r\n`);
  });
}

const contentLength = (head: string) => /\r\ncontent-length: *(\d+)/i.exec(head)?.[1];

// Refuted: no replay hangs its client or sends a length its body does not have. A body short of its
// declared length is a message its first client never received whole (it waits, as Node sends it):
// kept as a stream cut short, and replayed as the 500 response-not-replayable, framed by its own
// length. A body longer than its length is stored as its client read it: cut at the length.
describe('a declared length the body does not match', () => {
  const short: [string, (res: ServerResponse) => void, string][] = [
    [
      'writeHead(201, {Content-Length: 5}) then end() with no body',
      (res) => {
        res.writeHead(201, { 'Content-Length': '5' });
        res.end();
      },
      '',
    ],
    [
      'setHeader(Content-Length, 10) then end() of 5 bytes',
      (res) => {
        res.statusCode = 201;
        res.setHeader('Content-Length', 10);
        res.end('hello');
      },
      'hello',
    ],
  ];
  it.each(short)('%s: not stored; the replay is a whole 500 problem', async (_name, answer, sent) => {
    const served = await serve({ answer });
    try {
      const first = await rawPost(served.base, 'k-1', sent.length);
      expect(first.head).toMatch(/^HTTP\/1\.1 201 Created\r\n/);
      expect(first.body).toBe(sent);
      expect(served.notStored().map((event) => [event.type, 'reason' in event && event.reason])).toEqual([
        ['response-not-stored', 'streaming'],
      ]);
      const again = await served.post('k-1');
      expect(again.status).toBe(500);
      expect(JSON.parse(again.body.toString()).type).toBe('https://idem.dev/problems/response-not-replayable');
      expect(Number(again.headers['content-length'])).toBe(again.body.length);
    } finally {
      await served.close();
    }
  });

  it('setHeader(Content-Length, 2) then end() of 5 bytes: stored and replayed as the 2 bytes its client read', async () => {
    const served = await serve({
      answer: (res) => {
        res.statusCode = 201;
        res.setHeader('Content-Length', 2);
        res.end('hello');
      },
    });
    try {
      const first = await rawPost(served.base, 'k-1', 2);
      expect(contentLength(first.head)).toBe('2');
      const again = await rawPost(served.base, 'k-1', 2);
      expect(again.head).toMatch(/^HTTP\/1\.1 201 Created\r\n/);
      expect(again.head).toMatch(/\r\nidempotent-replayed: true\r\n/);
      expect([contentLength(again.head), again.body]).toEqual(['2', 'he']);
    } finally {
      await served.close();
    }
  });
});

// One store, two servers: node:http and node:http2's compatibility API (as Fastify's `http2: true`
// and Koa on `http2.createServer` serve), each with the HTTP layer in front of the same handler.
function mount(store: Store, answer: (res: ServerResponse) => void) {
  const layer = createHttpIdempotency({ store, scope: () => 'caller' });
  return async (req: IncomingMessage, res: ServerResponse) => {
    const started = await layer.begin({
      method: 'POST',
      route: '/charges',
      path: '/charges',
      query: '',
      contentType: undefined,
      keyHeader: layer.keyHeader(req),
      body: undefined,
      scope: 'caller',
    });
    if (started.kind === 'respond') return writeResponse(res, started.response);
    if (started.kind !== 'execute') return void res.end();
    res.setHeader('idempotency-key', started.echo);
    layer.capture(res, { settle: { lease: started.lease, thrown: () => false } });
    answer(res);
  };
}

interface Answer {
  status: number;
  statusMessage: string | undefined;
  headers: Record<string, unknown>;
  body: Buffer;
}

function h1(port: number, key: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: '127.0.0.1', port, method: 'POST', path: '/charges', headers: { 'idempotency-key': key }, agent: false },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            statusMessage: res.statusMessage,
            headers: res.headers,
            body: Buffer.concat(chunks),
          }),
        );
      },
    );
    req.on('error', reject);
    req.end();
  });
}

function h2(port: number, key: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on('error', reject);
    const stream = session.request({ ':method': 'POST', ':path': '/charges', 'idempotency-key': key });
    const chunks: Buffer[] = [];
    let head: http2.IncomingHttpHeaders = {};
    stream.on('response', (received) => {
      head = received;
    });
    stream.on('data', (chunk: Buffer) => chunks.push(chunk));
    stream.on('end', () => {
      session.close();
      const { ':status': status, ...headers } = head;
      resolve({ status: Number(status), statusMessage: undefined, headers, body: Buffer.concat(chunks) });
    });
    stream.on('error', reject);
    stream.end();
  });
}

async function listen(server: http.Server | http2.Http2Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
}

// Bytes that are no UTF-8, so a body decoded and encoded on the way would show.
const bodyBytes = Buffer.from([0x7b, 0xff, 0x00, 0xc3, 0x28, 0x7d]);

function answer(res: ServerResponse) {
  res.statusCode = 201;
  // Over HTTP/1.1 only: HTTP/2 has no phrase (Node warns when one is set there).
  if ((res as { stream?: unknown }).stream === undefined) res.statusMessage = 'Created Fine';
  res.setHeader('content-type', 'application/octet-stream');
  res.setHeader('location', '/charges/ch_1');
  res.setHeader('vary', 'accept');
  // Connection-specific: HTTP/1.1 only (Node throws on them over HTTP/2).
  if ((res as { stream?: unknown }).stream === undefined) {
    res.setHeader('connection', 'keep-alive');
    res.setHeader('keep-alive', 'timeout=7');
  }
  res.end(bodyBytes);
}

const kept = (headers: Record<string, unknown>) => ({
  'content-type': headers['content-type'],
  location: headers.location,
  vary: headers.vary,
});

describe('a first answer over one protocol replayed over the other, one store', () => {
  const orders = [
    ['HTTP/1.1 first, HTTP/2 replay', 'h1'],
    ['HTTP/2 first, HTTP/1.1 replay', 'h2'],
  ] as const;
  it.each(orders)('%s: status, headers and body bytes; the phrase only where there is one', async (_name, first) => {
    const inner = memoryStore();
    const stored: Record<string, string>[] = [];
    const store: Store = {
      ...inner,
      claim: (input) => inner.claim(input),
      renew: (input) => inner.renew(input),
      release: (input) => inner.release(input),
      get: (id) => inner.get(id),
      complete: (input) => {
        stored.push(input.response.headers);
        return inner.complete(input);
      },
    };
    const one = http.createServer(mount(store, answer));
    const two = http2.createServer(mount(store, answer) as never);
    const [p1, p2] = await Promise.all([listen(one), listen(two)]);
    try {
      const original = first === 'h1' ? await h1(p1, 'k-1') : await h2(p2, 'k-1');
      const replay = first === 'h1' ? await h2(p2, 'k-1') : await h1(p1, 'k-1');
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.status).toBe(201);
      expect(original.status).toBe(201);
      expect(kept(replay.headers)).toEqual(kept(original.headers));
      expect(kept(replay.headers)).toEqual({
        'content-type': 'application/octet-stream',
        location: '/charges/ch_1',
        vary: 'accept',
      });
      expect(replay.body.equals(bodyBytes)).toBe(true);
      expect(original.body.equals(bodyBytes)).toBe(true);
      // Over HTTP/1.1 the phrase is the handler's when it answered over HTTP/1.1, the default
      // otherwise (HTTP/2 had none to keep).
      if (first === 'h1') expect(original.statusMessage).toBe('Created Fine');
      else expect(replay.statusMessage).toBe('Created');
      // The HTTP/1.1 answer's connection fields stay with its connection: none is stored, so none
      // reaches a replay over HTTP/2 (malformed there) or over another HTTP/1.1 connection.
      expect(Object.keys(stored[0] ?? {}).sort()).toEqual(['content-type', 'location', 'vary']);
      expect(replay.headers['keep-alive']).not.toBe('timeout=7');
    } finally {
      one.closeAllConnections();
      await Promise.all([new Promise((r) => one.close(r)), new Promise((r) => two.close(r))]);
    }
  });
});
