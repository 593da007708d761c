import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { createHttpIdempotency } from '../src/http.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';

// The same records behind promises, as a store over a network answers.
function networkLike(): Store {
  const inner = memoryStore();
  return {
    claim: async (input) => inner.claim(input),
    renew: async (input) => inner.renew(input),
    complete: async (input) => inner.complete(input),
    release: async (input) => inner.release(input),
    get: async (id) => inner.get(id),
  };
}

// A node:http server with the HTTP layer in front of a handler that answers 201 in one `end`.
// `endedAtOnce` records, per first execution, whether the end had gone out when `end` returned.
// `answer` writes the first execution's response (default: status, then one `end`).
// `below` wraps the response before the capture does, as a layer mounted earlier (compression()) would.
async function serve(
  store: Store,
  answer = (res: ServerResponse, run: number) => {
    res.statusCode = 201;
    res.end(`{"run":${run}}`);
  },
  below?: (res: ServerResponse) => void,
) {
  const http = createHttpIdempotency({ store, scope: () => 'caller', replayHeaders: ['x-charge-version'] });
  const endedAtOnce: boolean[] = [];
  let runs = 0;
  const server = createServer(async (req, res) => {
    const started = await http.begin({
      method: 'POST',
      route: '/charges',
      path: '/charges',
      query: '',
      contentType: 'application/json',
      keyHeader: http.keyHeader(req),
      body: undefined,
      scope: 'caller',
    });
    if (started.kind !== 'execute') {
      const response = started.kind === 'respond' ? started.response : undefined;
      res.writeHead(response?.status ?? 500, response?.headers).end(response?.body);
      return;
    }
    below?.(res);
    http.capture(res, { settle: { lease: started.lease, thrown: () => false } });
    answer(res, ++runs);
    endedAtOnce.push(res.writableEnded);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/charges`;
  const post = async (key: string) => {
    const answer = await fetch(url, { method: 'POST', headers: { 'idempotency-key': key } });
    return {
      status: answer.status,
      replayed: answer.headers.get('idempotent-replayed'),
      encoding: answer.headers.get('content-encoding'),
      body: await answer.text(),
    };
  };
  const headersOf = async (key: string) =>
    (await fetch(url, { method: 'POST', headers: { 'idempotency-key': key } })).headers;
  return { post, headersOf, endedAtOnce, close: () => new Promise<void>((resolve) => server.close(() => resolve())) };
}

describe('the held end of a captured response', () => {
  it('goes out within `end` when the store answers at once (memoryStore), with the outcome already stored', async () => {
    const { post, endedAtOnce, close } = await serve(memoryStore());
    try {
      expect(await post('k-1')).toEqual({ status: 201, replayed: null, encoding: null, body: '{"run":1}' });
      expect(await post('k-1')).toEqual({ status: 201, replayed: 'true', encoding: null, body: '{"run":1}' });
      expect(endedAtOnce).toEqual([true]);
    } finally {
      await close();
    }
  });

  it('waits for a store that answers later, and the retry still replays', async () => {
    const { post, endedAtOnce, close } = await serve(networkLike());
    try {
      expect(await post('k-1')).toEqual({ status: 201, replayed: null, encoding: null, body: '{"run":1}' });
      expect(await post('k-1')).toEqual({ status: 201, replayed: 'true', encoding: null, body: '{"run":1}' });
      expect(endedAtOnce).toEqual([false]);
    } finally {
      await close();
    }
  });

  it('keeps the replayable headers given to writeHead alone (no setHeader before), and no others', async () => {
    const { headersOf, close } = await serve(memoryStore(), (res, run) => {
      res
        .writeHead(201, { 'content-type': 'application/json', 'x-charge-version': '7', 'x-request-id': 'r-1' })
        .end(`{"run":${run}}`);
    });
    try {
      expect((await headersOf('h-1')).get('x-request-id')).toBe('r-1');
      const again = await headersOf('h-1');
      expect(again.get('idempotent-replayed')).toBe('true');
      expect(again.get('content-type')).toBe('application/json');
      expect(again.get('x-charge-version')).toBe('7');
      expect(again.get('x-request-id')).toBeNull();
    } finally {
      await close();
    }
  });

  it('keeps a header repeated in a flat writeHead array (two Link fields) as one list', async () => {
    const { headersOf, close } = await serve(memoryStore(), (res, run) => {
      res
        .writeHead(201, [
          'content-type',
          'application/json',
          'link',
          '</p/2>; rel="next"',
          'link',
          '</p/9>; rel="last"',
        ])
        .end(`{"run":${run}}`);
    });
    try {
      await headersOf('l-1');
      const again = await headersOf('l-1');
      expect(again.get('idempotent-replayed')).toBe('true');
      expect(again.get('link')).toBe('</p/2>; rel="next", </p/9>; rel="last"');
    } finally {
      await close();
    }
  });

  it('keeps the headers of the bytes it copied, not what a layer below adds (compression)', async () => {
    // Like compression(): mounted before, it sets Content-Encoding when the head goes out and
    // compresses what is written through it, so the capture above it copies the plain bytes.
    const compressing = (res: ServerResponse) => {
      const writeHead = res.writeHead;
      const end = res.end;
      const chunks: Buffer[] = [];
      res.writeHead = function (this: ServerResponse, ...args: Parameters<ServerResponse['writeHead']>) {
        this.setHeader('content-encoding', 'gzip');
        return writeHead.apply(this, args);
      } as ServerResponse['writeHead'];
      res.write = function (this: ServerResponse, chunk: string) {
        if (!this.headersSent) this.writeHead(this.statusCode);
        chunks.push(Buffer.from(chunk));
        return true;
      } as ServerResponse['write'];
      res.end = function (this: ServerResponse, chunk?: string) {
        if (chunk) chunks.push(Buffer.from(chunk));
        if (!this.headersSent) this.writeHead(this.statusCode);
        return (end as (chunk: Buffer) => ServerResponse).call(this, gzipSync(Buffer.concat(chunks)));
      } as ServerResponse['end'];
    };
    const { post, close } = await serve(
      memoryStore(),
      (res, run) => {
        res.statusCode = 201;
        res.setHeader('content-type', 'text/plain');
        res.write('run ');
        res.end(String(run));
      },
      compressing,
    );
    try {
      expect(await post('z-1')).toEqual({ status: 201, replayed: null, encoding: 'gzip', body: 'run 1' });
      // Stored with Content-Encoding, the plain bytes would be replayed as gzip: unreadable.
      expect(await post('z-1')).toEqual({ status: 201, replayed: 'true', encoding: null, body: 'run 1' });
    } finally {
      await close();
    }
  });
});
