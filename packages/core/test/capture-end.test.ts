import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
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
async function serve(
  store: Store,
  answer = (res: ServerResponse, run: number) => {
    res.statusCode = 201;
    res.end(`{"run":${run}}`);
  },
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
    http.capture(res, { settle: { lease: started.lease, thrown: () => false } });
    answer(res, ++runs);
    endedAtOnce.push(res.writableEnded);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/charges`;
  const post = async (key: string) => {
    const answer = await fetch(url, { method: 'POST', headers: { 'idempotency-key': key } });
    return { status: answer.status, replayed: answer.headers.get('idempotent-replayed'), body: await answer.text() };
  };
  const headersOf = async (key: string) =>
    (await fetch(url, { method: 'POST', headers: { 'idempotency-key': key } })).headers;
  return { post, headersOf, endedAtOnce, close: () => new Promise<void>((resolve) => server.close(() => resolve())) };
}

describe('the held end of a captured response', () => {
  it('goes out within `end` when the store answers at once (memoryStore), with the outcome already stored', async () => {
    const { post, endedAtOnce, close } = await serve(memoryStore());
    try {
      expect(await post('k-1')).toEqual({ status: 201, replayed: null, body: '{"run":1}' });
      expect(await post('k-1')).toEqual({ status: 201, replayed: 'true', body: '{"run":1}' });
      expect(endedAtOnce).toEqual([true]);
    } finally {
      await close();
    }
  });

  it('waits for a store that answers later, and the retry still replays', async () => {
    const { post, endedAtOnce, close } = await serve(networkLike());
    try {
      expect(await post('k-1')).toEqual({ status: 201, replayed: null, body: '{"run":1}' });
      expect(await post('k-1')).toEqual({ status: 201, replayed: 'true', body: '{"run":1}' });
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
});
