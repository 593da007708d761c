// Edges of the Latin-1 head (see latin1-head.test.ts): every way a plain node:http handler can hand
// Node its first bytes, with a reason phrase and a header value that have characters U+0080..U+00FF.
// Read off a raw socket: the first answer's head is in Latin-1 (one byte per character), so the
// replay, which writes Latin-1, sends the same head bytes; the body bytes are what the handler wrote.
import type { ServerResponse } from 'node:http';
import { frameRequest, sendRaw } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import { serve } from './capture-server.js';
import { body, joined, latin1, location, phrase, request, statusLine, value } from './support/raw-head.js';

function prepare(res: ServerResponse, status = 201) {
  res.statusCode = status;
  res.statusMessage = phrase;
  res.setHeader('location', location);
}

// `answer` writes the first answer; the body the client must read is `sent` (bytes).
const ways: [string, (res: ServerResponse) => void, Buffer][] = [
  [
    "write('') first, then write(string), chunked",
    (res) => {
      prepare(res);
      res.write('');
      res.write(body);
      res.end();
    },
    Buffer.from(body),
  ],
  [
    "write('') first, then end(string), with a Content-Length",
    (res) => {
      prepare(res);
      res.setHeader('content-length', Buffer.byteLength(body));
      res.write('');
      res.end(body);
    },
    Buffer.from(body),
  ],
  [
    "write('', 'utf8') first, then end(string)",
    (res) => {
      prepare(res);
      res.write('', 'utf8');
      res.end(body);
    },
    Buffer.from(body),
  ],
  [
    "end('')",
    (res) => {
      prepare(res);
      res.end('');
    },
    Buffer.alloc(0),
  ],
  // Node takes any case and 'utf-8' (its types list only some spellings).
  ...(['utf-8', 'UTF8', 'UTF-8', 'utf8', 'latin1', 'binary'] as BufferEncoding[]).map(
    (encoding) =>
      [
        `end(string, '${encoding}')`,
        (res: ServerResponse) => {
          prepare(res);
          res.end(body, encoding);
        },
        Buffer.from(body, encoding),
      ] as [string, (res: ServerResponse) => void, Buffer],
  ),
  [
    "write(string, '') (an empty encoding, taken as UTF-8), with a Content-Length",
    (res) => {
      prepare(res);
      res.setHeader('content-length', Buffer.byteLength(body));
      // Short of the length: the last declared byte takes another path (see writeLast).
      res.write(body.slice(0, 7), '' as BufferEncoding);
      res.end(body.slice(7));
    },
    Buffer.from(body),
  ],
  [
    'write(string, null, callback), with a Content-Length',
    (res) => {
      prepare(res);
      res.setHeader('content-length', Buffer.byteLength(body));
      res.write(body.slice(0, 7), null as unknown as BufferEncoding, () => {});
      res.end(body.slice(7));
    },
    Buffer.from(body),
  ],
  [
    'cork(), two string writes, uncork(), end(), with a Content-Length',
    (res) => {
      prepare(res);
      res.setHeader('content-length', Buffer.byteLength(body));
      res.cork();
      res.write(body.slice(0, 7));
      res.write(body.slice(7, 9));
      res.uncork();
      res.end(body.slice(9));
    },
    Buffer.from(body),
  ],
  [
    'writeHead with an array of headers, then end(string)',
    (res) => {
      res.writeHead(201, phrase, ['location', location, 'content-type', 'application/json']);
      res.end(body);
    },
    Buffer.from(body),
  ],
  [
    'flushHeaders() twice, then end(string)',
    (res) => {
      prepare(res);
      res.flushHeaders();
      res.flushHeaders();
      res.end(body);
    },
    Buffer.from(body),
  ],
  [
    'writeHead, then flushHeaders(), then write(string) and end()',
    (res) => {
      res.writeHead(201, phrase, { location });
      res.flushHeaders();
      res.write(body);
      res.end();
    },
    Buffer.from(body),
  ],
];

describe.each([false, true])('held: %s', (hold) => {
  it.each(ways)(
    '%s: the head leaves in Latin-1, its replay sends the same head and body bytes',
    async (_, answer, sent) => {
      const served = await serve({ hold, answer: (res) => answer(res) });
      try {
        const port = Number(new URL(served.base).port);
        const first = await sendRaw(port, request('k-1'));
        const again = await sendRaw(port, request('k-1'));
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect(served.runs()).toBe(1);
        expect(statusLine(first).toString('hex')).toBe(latin1(`HTTP/1.1 201 ${phrase}`).toString('hex'));
        expect(value(first, 'location')?.toString('hex')).toBe(latin1(` ${location}`).toString('hex'));
        expect(statusLine(again).toString('hex')).toBe(statusLine(first).toString('hex'));
        expect(value(again, 'location')?.toString('hex')).toBe(value(first, 'location')?.toString('hex'));
        expect(first.body.toString('hex')).toBe(sent.toString('hex'));
        expect(again.body.toString('hex')).toBe(sent.toString('hex'));
      } finally {
        await served.close();
      }
    },
  );
});

describe.each([false, true])('held: %s, callbacks', (hold) => {
  it('write(string, callback) and end(string, callback): each callback is called once, the head in Latin-1', async () => {
    let wrote = 0;
    let ended = 0;
    let finished!: () => void;
    const done = new Promise<void>((resolve) => {
      finished = resolve;
    });
    const served = await serve({
      hold,
      answer: (res) => {
        prepare(res);
        res.write(body.slice(0, 7), () => wrote++);
        res.end(body.slice(7), () => {
          ended++;
          finished();
        });
      },
    });
    try {
      const port = Number(new URL(served.base).port);
      const first = await sendRaw(port, request('k-1'));
      await done;
      // A turn more, for a second call of either.
      await new Promise((resolve) => setImmediate(resolve));
      expect([wrote, ended]).toEqual([1, 1]);
      expect(statusLine(first).toString('hex')).toBe(latin1(`HTTP/1.1 201 ${phrase}`).toString('hex'));
      expect(first.body.toString()).toBe(body);
    } finally {
      await served.close();
    }
  });
});

// A 204 or 304 has no body: Node takes no write for it. A head flushed early went out through Node's
// own flushHeaders, as a string with no encoding (UTF-8); it now goes as Node's end() sends a head
// with no body, in Latin-1. Held, the head waits for the commit and leaves in Latin-1.
async function bodylessFlushed(status: number, hold: boolean) {
  const served = await serve({
    hold,
    answer: (res) => {
      prepare(res, status);
      res.flushHeaders();
      res.end();
    },
  });
  try {
    const port = Number(new URL(served.base).port);
    const first = await sendRaw(port, request('k-1'));
    const again = await sendRaw(port, request('k-1'));
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(statusLine(first).toString('hex')).toBe(latin1(`HTTP/1.1 ${status} ${phrase}`).toString('hex'));
    expect(statusLine(again).toString('hex')).toBe(statusLine(first).toString('hex'));
    expect(value(again, 'location')?.toString('hex')).toBe(value(first, 'location')?.toString('hex'));
  } finally {
    await served.close();
  }
}

describe.each([204, 304])('%s, flushHeaders() then end()', (status) => {
  it('held: the head leaves in Latin-1, as its replay', () => bodylessFlushed(status, true));
  // Was wrong: the first answer's head went out in UTF-8 (`CrÃ©Ã©`), its replay's in Latin-1.
  it('not held: the head leaves in Latin-1, as its replay', () => bodylessFlushed(status, false));
});

describe('held, flushHeaders() after writeHead', () => {
  it('the head the handler wrote is kept: its phrase and headers go out and are stored, plain ASCII too', async () => {
    const served = await serve({
      hold: true,
      answer: (res) => {
        res.writeHead(201, 'Created Fine', { location: '/charges/1', 'content-type': 'application/json' });
        res.flushHeaders();
        res.end(body);
      },
    });
    try {
      const first = await served.post('k-1');
      const again = await served.post('k-1');
      expect(again.headers['idempotent-replayed']).toBe('true');
      // Was wrong: Node's flushHeaders wrote its implicit head, writeHead(201), over the held one:
      // `201 Created` went out and was stored, without the Location given.
      for (const answer of [first, again]) {
        expect([answer.status, answer.statusMessage, answer.headers.location]).toEqual([
          201,
          'Created Fine',
          '/charges/1',
        ]);
        expect(answer.body.toString()).toBe(body);
      }
    } finally {
      await served.close();
    }
  });
});

// No phrase of its own: only one header value carries such characters, wherever it was set.
const onlyHeader: [string, (res: ServerResponse) => void, string][] = [
  [
    'a list set on the response, its second item',
    (res) => {
      res.statusCode = 201;
      res.setHeader('link', ['</charges>; rel="collection"', '</reçus>; rel="related"']);
      res.end(body);
    },
    'link',
  ],
  [
    'given to writeHead',
    (res) => {
      res.writeHead(201, { 'content-location': '/charges/naïve' });
      res.end(body);
    },
    'content-location',
  ],
  [
    'given to writeHead as a flat list',
    (res) => {
      res.writeHead(201, ['etag', '"v-é"']);
      res.end(body);
    },
    'etag',
  ],
  [
    'set on the response',
    (res) => {
      res.statusCode = 201;
      res.setHeader('content-language', 'fr');
      res.setHeader('location', location);
      res.end(body);
    },
    'location',
  ],
];

describe.each([false, true])('held: %s, one header value only', (hold) => {
  it.each(onlyHeader)('%s: it leaves in Latin-1, as its replay sends it', async (_, answer, name) => {
    const served = await serve({ hold, answer: (res) => answer(res) });
    try {
      const port = Number(new URL(served.base).port);
      const first = await sendRaw(port, request('k-1'));
      const again = await sendRaw(port, request('k-1'));
      expect(again.headers['idempotent-replayed']).toBe('true');
      const sent = joined(first, name).toString('latin1');
      expect([sent.includes('Ã'), /[\u0080-\u00ff]/.test(sent)]).toEqual([false, true]);
      expect(joined(again, name).toString('hex')).toBe(joined(first, name).toString('hex'));
      expect(first.body.toString()).toBe(body);
    } finally {
      await served.close();
    }
  });
});

// A HEAD has no body either: Node ignores any body write, so an empty write for a head with such
// characters sent nothing at all, and the head waited for the end (a handler that flushes early to
// tell its client it works, then takes its time, kept it waiting). How many bytes the socket took
// for the flush, and the status line the client read.
async function headFlushed(statusMessage: string): Promise<[number, Buffer]> {
  let flushed = -1;
  const served = await serve({
    answer: (res) => {
      res.statusCode = 201;
      res.statusMessage = statusMessage;
      const before = res.socket?.bytesWritten ?? 0;
      res.flushHeaders();
      flushed = (res.socket?.bytesWritten ?? 0) - before;
      res.end();
    },
  });
  try {
    const port = Number(new URL(served.base).port);
    const answer = await sendRaw(
      port,
      frameRequest(
        'HEAD /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nIdempotency-Key: k-1\r\n',
        Buffer.alloc(0),
      ).bytes,
    );
    return [flushed, statusLine(answer)];
  } finally {
    await served.close();
  }
}

it('a HEAD: flushHeaders() with an ASCII head sends it at once', async () => {
  const [flushed, line] = await headFlushed('Created Fine');
  expect(flushed).toBeGreaterThan(0);
  expect(line.toString()).toBe('HTTP/1.1 201 Created Fine');
});
// Was wrong: with such characters the head did not leave at flushHeaders() but at the end.
it('a HEAD: flushHeaders() with a head of such characters sends it at once, in Latin-1', async () => {
  const [flushed, line] = await headFlushed(phrase);
  expect(flushed).toBeGreaterThan(0);
  expect(line.toString('hex')).toBe(latin1(`HTTP/1.1 201 ${phrase}`).toString('hex'));
});

// A body write to a response that has none (a 204, a HEAD) is dropped by Node, which keeps the head
// back: a flushHeaders() after it is what sends the head. The capture took that write as the one the
// head had left with, and let the flush through to Node's own, which sent the head in UTF-8.
async function writtenThenFlushed(method: 'POST' | 'HEAD', status: number) {
  const served = await serve({
    answer: (res) => {
      prepare(res, status);
      res.write('x');
      res.flushHeaders();
      res.end();
    },
  });
  try {
    const port = Number(new URL(served.base).port);
    const framed = (key: string) =>
      frameRequest(
        `${method} /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nIdempotency-Key: ${key}\r\n`,
        Buffer.alloc(0),
      ).bytes;
    const first = await sendRaw(port, framed('k-1'));
    const again = await sendRaw(port, framed('k-1'));
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(statusLine(first).toString('hex')).toBe(latin1(`HTTP/1.1 ${status} ${phrase}`).toString('hex'));
    expect(value(first, 'location')?.toString('hex')).toBe(latin1(` ${location}`).toString('hex'));
    expect(statusLine(again).toString('hex')).toBe(statusLine(first).toString('hex'));
  } finally {
    await served.close();
  }
}

// Was wrong: the first answer's head went out in UTF-8 (`CrÃ©Ã©`), its replay's in Latin-1.
it('a 204: write(string), then flushHeaders(): the head leaves in Latin-1, as its replay', () =>
  writtenThenFlushed('POST', 204));
it('a HEAD: write(string), then flushHeaders(): the head leaves in Latin-1, as its replay', () =>
  writtenThenFlushed('HEAD', 201));
