// The framework-free HTTP layer's options, begin() and body reading: behaviours that mutation
// testing of packages/core/src/http-*.ts showed no test held.
import { createServer, IncomingMessage, type Server, ServerResponse } from 'node:http';
import { type AddressInfo, connect, Socket } from 'node:net';
import { PassThrough, Readable } from 'node:stream';
import { transactionalMemoryStore } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import type { IdempotencyEvent } from '../src/events.js';
import { type ReadBodyResult, readBodyForFingerprint, readStream } from '../src/http-body.js';
import { createHttpIdempotency } from '../src/http-idempotency.js';
import type { HttpRequestInfo, ResponseCapture } from '../src/http-types.js';
import { memoryStore } from '../src/memory-store.js';
import type { TransactionalStore } from '../src/transactional.js';

const charge = (overrides: Partial<HttpRequestInfo> = {}): HttpRequestInfo => ({
  method: 'POST',
  route: '/charges',
  path: '/charges',
  query: '',
  contentType: 'application/json',
  keyHeader: 'k-1',
  body: Buffer.from('{"amount":1}'),
  scope: 'caller',
  ...overrides,
});

describe('createHttpIdempotency: options are checked once, at construction', () => {
  it('refuses a missing options object with a message that names what it needs', () => {
    for (const bad of [null, undefined, 'store']) {
      expect(() => createHttpIdempotency(bad as never)).toThrow(
        new TypeError('idempotency needs an options object with a store'),
      );
    }
  });

  it('refuses required and mintKeys that are not booleans, rather than reading them as truthy', () => {
    for (const bad of ['false', 0, 1]) {
      expect(() => createHttpIdempotency({ store: memoryStore(), required: bad as never })).toThrow(
        new TypeError('required must be a boolean'),
      );
      expect(() => createHttpIdempotency({ store: memoryStore(), mintKeys: bad as never })).toThrow(
        new TypeError('mintKeys must be a boolean'),
      );
    }
  });

  it('refuses a body or response limit that is no whole number of bytes', () => {
    for (const name of ['maxBodyBytes', 'maxResponseBytes'] as const) {
      for (const bad of [1.5, 0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
        expect(() => createHttpIdempotency({ store: memoryStore(), [name]: bad }), `${name}: ${bad}`).toThrow(
          new TypeError(`${name} must be a positive integer`),
        );
      }
    }
    expect(createHttpIdempotency({ store: memoryStore(), maxBodyBytes: 1 }).maxBodyBytes).toBe(1);
  });

  it('replayHeaders refuses a per-request header, but not a name that only begins like one', async () => {
    expect(() => createHttpIdempotency({ store: memoryStore(), replayHeaders: ['Date'] })).toThrow(TypeError);
    const http = createHttpIdempotency({ store: memoryStore(), replayHeaders: ['Age-Rating', 'X-Request-Identity'] });
    const replayed = http.replay(
      { status: 200, headers: { 'age-rating': '12', 'x-request-identity': 'ledger' }, body: new Uint8Array() },
      'k-1',
    );
    expect(replayed.headers).toMatchObject({ 'age-rating': '12', 'x-request-identity': 'ledger' });
  });

  it('covers the configured methods whatever their case', () => {
    const http = createHttpIdempotency({ store: memoryStore() });
    expect([http.covers('post'), http.covers('Patch'), http.covers('put')]).toEqual([true, true, false]);
  });
});

describe('createHttpIdempotency: events and replays', () => {
  it('stamps a response-not-stored event with the injected clock', async () => {
    const events: IdempotencyEvent[] = [];
    const http = createHttpIdempotency({
      store: memoryStore(),
      now: () => 1_000,
      onEvent: (event) => events.push(event),
    });
    const started = await http.begin(charge());
    if (started.kind !== 'execute') throw new Error('expected execute');
    await http.settle(started.lease, { kind: 'unstorable', reason: 'streaming', status: 200 }, false);
    expect(events.find((event) => event.type === 'response-not-stored')).toMatchObject({
      reason: 'streaming',
      status: 200,
      at: 1_000,
    });
  });

  it('release() on the context wins over the policy, for a response that cannot be replayed too; after the settlement it changes nothing', async () => {
    const events: IdempotencyEvent[] = [];
    const http = createHttpIdempotency({ store: memoryStore(), onEvent: (event) => events.push(event) });
    const begin = () => http.begin(charge({ keyHeader: 'said-so' }));
    const first = await begin();
    if (first.kind !== 'execute') throw new Error('expected execute');
    http.context(first).release();
    await http.settle(first.lease, { kind: 'unstorable', reason: 'too-large', status: 201 }, false);
    // As a policy that releases says it: `release`, then `not-stored` with the status sent.
    expect(events.map((event) => event.type)).toEqual(['claim', 'response-not-stored', 'release', 'not-stored']);
    expect(events.at(-1)).toMatchObject({ status: 201 });
    const second = await begin();
    if (second.kind !== 'execute') throw new Error('expected execute');
    const stored = { status: 201, headers: {}, body: Buffer.from('{}') };
    await http.settle(second.lease, { kind: 'complete', response: stored }, false);
    http.context(second).release();
    expect((await begin()).kind).toBe('respond');
  });

  it("settles a response that cannot be replayed per a preset for the status the client was sent ('success': a 201 is kept, a 502 released)", async () => {
    const events: IdempotencyEvent[] = [];
    const http = createHttpIdempotency({
      store: memoryStore(),
      storeOutcome: 'success',
      onEvent: (event) => events.push(event),
    });
    const settled = async (key: string, status: number) => {
      const started = await http.begin(charge({ keyHeader: key }));
      if (started.kind !== 'execute') throw new Error('expected execute');
      await http.settle(started.lease, { kind: 'unstorable', reason: 'too-large', status }, false);
      return (await http.begin(charge({ keyHeader: key }))).kind;
    };
    expect(await settled('ok', 201)).toBe('respond');
    expect(await settled('bad-gateway', 502)).toBe('execute');
    expect(events.filter((event) => event.type === 'not-stored')).toMatchObject([{ status: 502 }]);
    expect(events.filter((event) => event.type === 'complete')).toMatchObject([{ status: 500 }]);
  });

  it("releases the key when even the stored answer in place of a response is over the store's cap", async () => {
    const events: IdempotencyEvent[] = [];
    const store = Object.assign(memoryStore(), { maxResponseBytes: 100 });
    const http = createHttpIdempotency({ store, onEvent: (event) => events.push(event) });
    const started = await http.begin(charge({ keyHeader: 'tiny-cap' }));
    if (started.kind !== 'execute') throw new Error('expected execute');
    await http.settle(started.lease, { kind: 'unstorable', reason: 'streaming', status: 200 }, false);
    expect((await http.begin(charge({ keyHeader: 'tiny-cap' }))).kind).toBe('execute');
    expect(events.some((event) => event.type === 'store-error' || event.type === 'complete')).toBe(false);
  });

  it('settles a response that cannot be replayed per the policy for the status the client was sent', async () => {
    const asked: unknown[] = [];
    const http = createHttpIdempotency({
      store: memoryStore(),
      // Keeps 2xx only, as 'success' does: what decides is the 200 sent, not the 500 stored.
      storeOutcome: (outcome) => {
        asked.push(outcome);
        return outcome.status < 300;
      },
    });
    const settled = async (key: string, reason: 'streaming' | 'too-large', status: number) => {
      const started = await http.begin(charge({ keyHeader: key }));
      if (started.kind !== 'execute') throw new Error('expected execute');
      await http.settle(
        started.lease,
        { kind: 'unstorable', reason, status, expires: 'Sun, 06 Nov 1994 08:49:37 GMT' },
        true,
      );
      return http.begin(charge({ keyHeader: key }));
    };
    const kept = await settled('kept', 'streaming', 200);
    if (kept.kind !== 'respond') throw new Error('expected a replay');
    expect(kept.response.status).toBe(500);
    expect(kept.response.headers['idempotent-replayed']).toBe('true');
    // Without advertiseExpiry the header is not replayed, though the capture passed it on.
    expect(kept.response.headers['idempotency-expires']).toBeUndefined();
    expect(JSON.parse(Buffer.from(kept.response.body).toString())).toMatchObject({
      code: 'response_not_replayable',
      retryable: false,
    });
    expect((await settled('released', 'too-large', 502)).kind).toBe('execute');
    expect(asked).toEqual([
      { status: 200, thrown: true, unreplayable: 'streaming', operation: 'POST /charges' },
      { status: 502, thrown: true, unreplayable: 'too-large', operation: 'POST /charges' },
    ]);
  });

  it('a replay carries only allowlisted headers, even from a record stored with others', () => {
    // A record written before replayHeaders lost a name (a rolling deploy), or by another instance.
    const http = createHttpIdempotency({ store: memoryStore() });
    const replayed = http.replay(
      {
        status: 201,
        headers: { 'content-type': 'application/json', 'x-internal-trace': 'abc', 'set-cookie': 'sid=1' },
        body: new Uint8Array(),
      },
      'k-1',
    );
    expect(replayed.headers).toEqual({
      'content-type': 'application/json',
      'idempotency-key': 'k-1',
      'idempotent-replayed': 'true',
      'cache-control': 'no-store',
    });
  });
});

describe("capture.failedWith: which errors are a body parser's refusal", () => {
  const refusal = (error: unknown) => {
    const http = createHttpIdempotency({ store: memoryStore() });
    const res = new ServerResponse(new IncomingMessage(new Socket()));
    return http.capture(res).failedWith(error);
  };
  const typed = (type: string, status = 400) => Object.assign(new Error('refused'), { status, type });

  it('takes every refusal body-parser and raw-body raise, whatever its 4xx status', () => {
    const types = [
      'entity.parse.failed',
      'entity.verify.failed',
      'entity.too.large',
      'encoding.unsupported',
      'charset.unsupported',
      'request.aborted',
      'request.size.invalid',
      'stream.encoding.set',
      'stream.not.readable',
      'parameters.too.many',
      'querystring.parse.rangeError',
    ];
    for (const type of types) expect(refusal(typed(type)), type).toBe(true);
    expect(refusal(typed('entity.too.large', 413))).toBe(true);
    expect(refusal(typed('charset.unsupported', 415))).toBe(true);
    expect(refusal(typed('entity.parse.failed', 499))).toBe(true);
    // http-errors sets both; an error of one's own may carry only statusCode.
    expect(refusal(Object.assign(new Error('refused'), { statusCode: 413, type: 'entity.too.large' }))).toBe(true);
  });

  it("takes co-body's untyped parse error: status 400 and the unparsed text in body", () => {
    expect(refusal(Object.assign(new SyntaxError('Unexpected token'), { status: 400, body: '{"amount":' }))).toBe(true);
    // The same shape with another status, with no body, or not an Error at all is no refusal.
    expect(refusal(Object.assign(new SyntaxError('Unexpected token'), { status: 422, body: '{"amount":' }))).toBe(
      false,
    );
    expect(refusal(Object.assign(new Error('Bad Request'), { status: 400 }))).toBe(false);
    expect(refusal({ status: 400, body: '{"amount":' })).toBe(false);
  });

  it("takes nothing else: a handler's own errors, 5xx, unknown types and non-objects", () => {
    expect(refusal(typed('entity.parse.failed', 500))).toBe(false);
    expect(refusal(typed('entity.parse.failed', 399))).toBe(false);
    expect(refusal(typed('validation.failed'))).toBe(false);
    expect(refusal(Object.assign(new Error('nope'), { status: 403 }))).toBe(false);
    for (const thrown of [null, undefined, 'entity.parse.failed', 400])
      expect(refusal(thrown), String(thrown)).toBe(false);
  });
});

describe('begin: keys missing, minted and overridden per route', () => {
  it('a minted key is flagged minted, in the result and in the context the handler sees', async () => {
    const http = createHttpIdempotency({ store: memoryStore(), mintKeys: true });
    const started = await http.begin(charge({ keyHeader: undefined }));
    if (started.kind !== 'execute') throw new Error('expected execute');
    expect(started.minted).toBe(true);
    expect(started.echo).toBe(started.key);
    expect(http.context(started)).toMatchObject({ key: started.key, minted: true });
    const sent = await http.begin(charge({ keyHeader: 'k-2' }));
    if (sent.kind !== 'execute') throw new Error('expected execute');
    expect([sent.minted, http.context(sent).minted]).toEqual([false, false]);
  });

  it("a route's overrides decide for a keyless request: required false passes it, mintKeys mints it", async () => {
    const http = createHttpIdempotency({ store: memoryStore() });
    const keyless = charge({ keyHeader: undefined });
    expect(await http.begin(keyless, { required: false })).toEqual({ kind: 'pass' });
    expect(http.refusesKey(undefined, { required: false })).toBe(false);
    expect(http.handles('POST', undefined, { required: false })).toBe(false);
    const minted = await http.begin(keyless, { mintKeys: true });
    expect(minted).toMatchObject({ kind: 'execute', minted: true });
    const optional = createHttpIdempotency({ store: memoryStore(), required: false });
    expect(await optional.begin(keyless, { required: true })).toMatchObject({
      kind: 'respond',
      response: { status: 400 },
    });
    expect(optional.refusesKey(undefined, { required: true })).toBe(true);
    expect(optional.handles('POST', undefined, { required: true })).toBe(true);
    expect(optional.handles('POST', undefined, { mintKeys: true })).toBe(true);
    expect(optional.refusesKey(undefined, { required: true, mintKeys: true })).toBe(false);
  });

  it('echoes the field as the client sent it, quoted or not, without the whitespace around it', async () => {
    const http = createHttpIdempotency({ store: memoryStore() });
    for (const [field, echo] of [
      ['  "k-1"\t', '"k-1"'],
      [' k-2 ', 'k-2'],
      [['"k-3" '], '"k-3"'],
    ] as const) {
      const started = await http.begin(charge({ keyHeader: field }));
      expect(started).toMatchObject({ kind: 'execute', echo });
    }
  });
});

describe('begin: the operation', () => {
  it('one key under a method spelled in another case is the same operation: the retry replays', async () => {
    const http = createHttpIdempotency({ store: memoryStore() });
    const first = await http.begin(charge({ method: 'POST' }));
    if (first.kind !== 'execute') throw new Error('expected execute');
    await http.settle(
      first.lease,
      { kind: 'complete', response: { status: 201, headers: {}, body: Buffer.from('{"id":"ch_1"}') } },
      false,
    );
    const retry = await http.begin(charge({ method: 'post' }));
    expect(retry).toMatchObject({
      kind: 'respond',
      response: { status: 201, headers: { 'idempotent-replayed': 'true' } },
    });
  });
});

describe('settle: what reaches the store', () => {
  it("stores a response with the replayed headers only: another request's cookie never rests in the store", async () => {
    const store = memoryStore();
    const http = createHttpIdempotency({ store, replayHeaders: ['x-charge-version'] });
    const started = await http.begin(charge());
    if (started.kind !== 'execute') throw new Error('expected execute');
    const headers = {
      'content-type': 'application/json',
      'x-charge-version': '3',
      'set-cookie': 'sid=secret',
      'x-request-id': 'req-1',
      'x-internal': 'yes',
    };
    await http.settle(
      started.lease,
      { kind: 'complete', response: { status: 201, headers, body: Buffer.from('{}') } },
      false,
    );
    const record = await store.get(started.lease.id);
    expect(record?.state === 'completed' && record.response.headers).toEqual({
      'content-type': 'application/json',
      'x-charge-version': '3',
    });
  });
});

describe('runTransaction: a transaction that never began, and what a commit stores', () => {
  // One POST in transactional mode through the HTTP layer on a real server; `handle` is the handler.
  async function transactionalServer(
    store: TransactionalStore,
    handle: (res: ServerResponse, capture: ResponseCapture) => void,
    { thrown = false, storeOutcome }: { thrown?: boolean; storeOutcome?: 'stripe' } = {},
  ) {
    const http = createHttpIdempotency({ store, transactional: true, ...(storeOutcome ? { storeOutcome } : {}) });
    const calls = { started: 0, notStarted: 0, leaseId: '' };
    const server: Server = createServer(async (_req, res) => {
      const started = await http.begin(charge());
      if (started.kind !== 'execute') throw new Error('expected execute');
      calls.leaseId = started.lease.id;
      const capture = http.capture(res, { hold: true });
      await http.runTransaction(
        started.lease,
        capture,
        () => {
          calls.started++;
          handle(res, capture);
        },
        () => thrown,
        () => calls.notStarted++,
      );
      // A response completed from the framework's state (its client gone) is never written.
      if (!res.writableEnded) res.destroy();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
    return { http, calls, server, url };
  }

  it('calls notStarted once, after the 503, only when the transaction could not begin', async () => {
    const inner = memoryStore();
    const down: TransactionalStore = {
      ...transactionalMemoryStore({ store: inner }),
      transaction: async () => {
        throw new Error('connection refused');
      },
    };
    const failing = await transactionalServer(down, (res) => res.end());
    const working = await transactionalServer(transactionalMemoryStore(), (res) => {
      res.statusCode = 201;
      res.end('{"id":"ch_1"}');
    });
    try {
      const refused = await fetch(failing.url, { method: 'POST' });
      expect(refused.status).toBe(503);
      expect(refused.headers.get('retry-after')).not.toBeNull();
      expect(failing.calls).toMatchObject({ started: 0, notStarted: 1 });
      // Nothing ran: the key is free for the retry at once, not after a lease.
      expect(await inner.get(failing.calls.leaseId)).toBeUndefined();
      const answered = await fetch(working.url, { method: 'POST' });
      expect([answered.status, await answered.text()]).toEqual([201, '{"id":"ch_1"}']);
      expect(working.calls).toMatchObject({ started: 1, notStarted: 0 });
    } finally {
      failing.server.close();
      working.server.close();
    }
  });

  it("tells the outcome policy the handler threw: with 'stripe', a thrown 4xx is not committed and the key is free", async () => {
    const inner = memoryStore();
    const answer = (res: ServerResponse) => {
      res.statusCode = 409;
      res.end('{"error":"conflict"}');
    };
    const threw = await transactionalServer(transactionalMemoryStore({ store: inner }), answer, {
      thrown: true,
      storeOutcome: 'stripe',
    });
    try {
      const response = await fetch(threw.url, { method: 'POST' });
      expect(response.status).toBe(409);
      await response.text();
      expect(await inner.get(threw.calls.leaseId)).toBeUndefined();
    } finally {
      threw.server.close();
    }
  });

  it("commits a response with the replayed headers only, even one completed from a framework's state", async () => {
    const inner = memoryStore();
    const { calls, server, url } = await transactionalServer(
      transactionalMemoryStore({ store: inner }),
      (_res, capture) =>
        capture.completeWith({
          status: 201,
          headers: { 'content-type': 'application/json', 'set-cookie': 'sid=secret' },
          body: Buffer.from('{}'),
        }),
    );
    try {
      await fetch(url, { method: 'POST' }).then(
        (response) => response.text(),
        () => undefined,
      );
      const record = await inner.get(calls.leaseId);
      expect(record?.state === 'completed' && record.response.headers).toEqual({ 'content-type': 'application/json' });
    } finally {
      server.close();
    }
  });
});

// A server that reads each request's body with readBodyForFingerprint and answers its status.
async function readingServer(limit: number) {
  const reads: unknown[] = [];
  const listeners: number[][] = [];
  const server = createServer(async (req, res) => {
    const events = ['readable', 'data', 'end', 'error'] as const;
    const before = events.map((name) => req.listenerCount(name));
    const read = await readBodyForFingerprint(req, limit, {});
    listeners.push(events.map((name, i) => req.listenerCount(name) - (before[i] as number)));
    reads.push(read);
    req.resume();
    res.writeHead(read.ok ? 200 : read.error.status).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  // One request over a fresh socket: with a Content-Length, or chunked in the given parts.
  const send = (body: string | string[]) =>
    new Promise<string>((resolve, reject) => {
      const socket = connect(port, '127.0.0.1');
      let answer = '';
      socket.on('data', (chunk) => {
        answer += chunk.toString('latin1');
      });
      socket.on('end', () => resolve(answer.slice(9, 12)));
      socket.on('error', reject);
      const head = 'POST /charges HTTP/1.1\r\nHost: x\r\nConnection: close\r\n';
      if (typeof body === 'string') {
        socket.write(`${head}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
      } else {
        const chunks = body.map((part) => `${Buffer.byteLength(part).toString(16)}\r\n${part}\r\n`).join('');
        socket.write(`${head}Transfer-Encoding: chunked\r\n\r\n${chunks}0\r\n\r\n`);
      }
    });
  return { reads, listeners, send, close: () => server.close() };
}

describe('readBodyForFingerprint: the limit and the request left behind', () => {
  it('takes a body of exactly maxBodyBytes, declared or chunked; one byte more is 413', async () => {
    const server = await readingServer(12);
    try {
      expect(await server.send('{"amount":1}')).toBe('200');
      expect(await server.send(['{"amou', 'nt":1}'])).toBe('200');
      expect(await server.send('{"amount":12}')).toBe('413');
      expect(await server.send(['{"amou', 'nt":12}'])).toBe('413');
      expect(server.reads.slice(0, 2)).toEqual([
        { ok: true, body: Buffer.from('{"amount":1}') },
        { ok: true, body: Buffer.from('{"amount":1}') },
      ]);
    } finally {
      server.close();
    }
  });

  it('leaves no listener of its own on the request once the body is read or refused', async () => {
    const server = await readingServer(12);
    try {
      await server.send('{"amount":1}');
      await server.send(['{"amou', 'nt":1}']);
      await server.send(['{"amou', 'nt":12}']);
      expect(server.listeners).toEqual([
        [0, 0, 0, 0],
        [0, 0, 0, 0],
        [0, 0, 0, 0],
      ]);
    } finally {
      server.close();
    }
  });
});

describe('readStream: a payload stream read into memory', () => {
  const read = (stream: Readable, limit: number, declared?: string | number): Promise<ReadBodyResult> =>
    readStream(stream, limit, declared);

  it('takes a stream of exactly maxBytes, in one chunk or many; one byte more is 413', async () => {
    expect(await read(Readable.from([Buffer.from('{"amount":1}')]), 12)).toEqual({
      ok: true,
      body: Buffer.from('{"amount":1}'),
    });
    expect(await read(Readable.from(['{"am', 'ount', '":1}'].map((part) => Buffer.from(part))), 12)).toEqual({
      ok: true,
      body: Buffer.from('{"amount":1}'),
    });
    expect(await read(Readable.from([Buffer.from('{"amount":12}')]), 12)).toMatchObject({
      ok: false,
      error: { code: 'body_too_large', status: 413 },
    });
  });

  it('refuses a declared length over the limit at once, and takes one of exactly the limit', async () => {
    // The stream itself is small: only the declared length can answer 413.
    expect(await read(Readable.from([Buffer.from('{}')]), 12, '13')).toMatchObject({
      ok: false,
      error: { code: 'body_too_large', status: 413 },
    });
    const exact = new PassThrough();
    exact.end('{"amount":1}');
    expect(await read(exact, 12, 12)).toEqual({ ok: true, body: Buffer.from('{"amount":1}') });
  });

  it('reads string chunks as their UTF-8 bytes, and counts bytes, not characters, against the limit', async () => {
    expect(await read(Readable.from(['{"name":', '"Zoë"}']), 64)).toEqual({
      ok: true,
      body: Buffer.from('{"name":"Zoë"}'),
    });
    // Six characters, twelve bytes.
    expect(await read(Readable.from(['éééééé']), 10)).toMatchObject({ ok: false, error: { status: 413 } });
  });

  it('leaves no listener of its own on the stream once it is read or refused', async () => {
    const events = ['data', 'end', 'error', 'readable'] as const;
    const whole = Readable.from([Buffer.from('{"amount":1}')]);
    await read(whole, 64);
    const over = new PassThrough();
    const refusing = read(over, 4);
    over.write('{"amount":1}');
    await refusing;
    for (const stream of [whole, over]) expect(events.map((name) => stream.listenerCount(name))).toEqual([0, 0, 0, 0]);
  });

  it('an error mid-stream is an incomplete body, never a shorter one', async () => {
    const stream = new PassThrough();
    const reading = read(stream, 64);
    stream.write('{"amount"');
    stream.destroy(new Error('aborted'));
    expect(await reading).toMatchObject({ ok: false, error: { code: 'body_incomplete', status: 400 } });
  });
});

describe('readBodyForFingerprint after a parser that left bytes', () => {
  it('fingerprints the bytes express.raw() left as they are, not as a JSON value', async () => {
    const drained = { headers: { 'content-length': '3' }, readableEnded: true } as unknown as IncomingMessage;
    const bytes = Buffer.from([0x01, 0x02, 0x03]);
    expect(await readBodyForFingerprint(drained, 64, { body: bytes })).toEqual({ ok: true, body: bytes });
  });
});

describe('keyHeader: the Idempotency-Key field values of a request', () => {
  const http = createHttpIdempotency({ store: memoryStore() });
  const request = (fields: Record<string, unknown>) => fields as unknown as IncomingMessage;

  it('finds the field whatever the case of its name, each field apart', () => {
    expect(http.keyHeader(request({ rawHeaders: ['Host', 'x', 'IDEMPOTENCY-KEY', '"k-1"'], headers: {} }))).toEqual([
      '"k-1"',
    ]);
    expect(
      http.keyHeader(
        request({ rawHeaders: ['idempotency-key', 'a', 'Content-Type', 'x', 'Idempotency-Key', 'b'], headers: {} }),
      ),
    ).toEqual(['a', 'b']);
    expect(http.keyHeader(request({ rawHeaders: ['Idempotency-Keys', 'a'], headers: {} }))).toBeUndefined();
  });

  it('falls back to the parsed headers of a request without raw ones, still each field apart', () => {
    expect(
      http.keyHeader(
        request({ headersDistinct: { 'idempotency-key': ['a', 'b'] }, headers: { 'idempotency-key': 'a, b' } }),
      ),
    ).toEqual(['a', 'b']);
    expect(http.keyHeader(request({ headers: { 'idempotency-key': 'k-1' } }))).toBe('k-1');
    // A key a middleware set on the parsed headers only.
    expect(http.keyHeader(request({ rawHeaders: [], headers: { 'idempotency-key': 'k-2' } }))).toBe('k-2');
  });
});
