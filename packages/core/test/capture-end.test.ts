import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import { transactionalMemoryStore } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import type { Duration } from '../src/duration.js';
import type { IdempotencyEvent } from '../src/events.js';
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
  // A response that never ends keeps its connection busy: closed too, rather than waited for.
  const close = () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    });
  return { post, headersOf, endedAtOnce, close };
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

  it('with every declared byte written and no `end`, settles on the last byte: the client is not left waiting for it', async () => {
    const body = (run: number) => `{"run":${run},"pad":"${'x'.repeat(100)}"}`;
    const lengthOnly = (res: ServerResponse, run: number) => {
      res.writeHead(201, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body(run)) });
      res.write(body(run).slice(0, 20));
      res.write(body(run).slice(20));
    };
    for (const store of [memoryStore(), networkLike()]) {
      const { post, close } = await serve(store, lengthOnly);
      try {
        expect(await post('cl-1')).toEqual({ status: 201, replayed: null, encoding: null, body: body(1) });
        expect(await post('cl-1')).toEqual({ status: 201, replayed: 'true', encoding: null, body: body(1) });
      } finally {
        await close();
      }
    }
  });

  it('an `end` (or a write) after the last declared byte follows that byte, which waits for the outcome', async () => {
    const { post, close } = await serve(networkLike(), (res, run) => {
      res.writeHead(201, { 'content-type': 'text/plain', 'content-length': '6' });
      res.write(`run ${run}!`);
      // While the store has not answered, the last byte is held: the end must not overtake it.
      res.write('');
      res.end();
    });
    try {
      expect(await post('cl-2')).toEqual({ status: 201, replayed: null, encoding: null, body: 'run 1!' });
      expect(await post('cl-2')).toEqual({ status: 201, replayed: 'true', encoding: null, body: 'run 1!' });
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

// A node:http server whose handler answers 201 on /charges and, elsewhere, what `answer` writes (by
// default a 404 in one `end`), as a framework's not-found answer: the capture is told with
// `unrouted` that no route took it. The key is echoed as the adapters do, and `echo` is passed on.
async function serveRoutes(
  store: Store,
  {
    hold = false,
    echo = false,
    answer,
    lease,
  }: { hold?: boolean; echo?: boolean; answer?: (res: ServerResponse) => void; lease?: Duration } = {},
) {
  const events: IdempotencyEvent[] = [];
  const http = createHttpIdempotency({
    store,
    scope: () => 'caller',
    onEvent: (event) => events.push(event),
    ...(lease === undefined ? {} : { lease }),
  });
  let runs = 0;
  const server = createServer(async (req, res) => {
    const path = req.url ?? '/';
    const started = await http.begin({
      method: 'POST',
      route: path,
      path,
      query: '',
      contentType: undefined,
      keyHeader: http.keyHeader(req),
      body: undefined,
      scope: 'caller',
    });
    if (started.kind !== 'execute') {
      const response = started.kind === 'respond' ? started.response : undefined;
      res.writeHead(response?.status ?? 500, response?.headers).end(response?.body);
      return;
    }
    runs++;
    res.setHeader('idempotency-key', started.echo);
    const unrouted = () => path !== '/charges' && res.statusCode === 404;
    const atEnd = echo ? { unrouted, echo: started.echo } : { unrouted };
    const write = () => {
      if (path === '/charges') {
        res.statusCode = 201;
        res.end('{"id":"ch_1"}');
      } else if (answer) answer(res);
      else {
        res.statusCode = 404;
        res.end('no such route');
      }
    };
    if (!hold) {
      http.capture(res, { settle: { lease: started.lease, thrown: () => false }, ...atEnd });
      write();
      return;
    }
    const capture = http.capture(res, { hold: true, ...atEnd });
    void http.runTransaction(started.lease, capture, write, () => false);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  // With `leaveOnce`, the client leaves once it resolves (the fetch then rejects).
  const post = async (path: string, key: string, leaveOnce?: Promise<void>) => {
    const leave = new AbortController();
    void leaveOnce?.then(() => leave.abort());
    const answer = await fetch(`${base}${path}`, {
      method: 'POST',
      headers: { 'idempotency-key': key },
      signal: leave.signal,
    });
    return {
      status: answer.status,
      key: answer.headers.get('idempotency-key'),
      replayed: answer.headers.get('idempotent-replayed'),
      body: await answer.text(),
    };
  };
  return { post, events, runs: () => runs, close: () => new Promise<void>((resolve) => server.close(() => resolve())) };
}

// Resolves once `done()` holds, checking on every turn of the event loop (no fixed sleep).
async function waitFor(done: () => boolean) {
  while (!done()) await new Promise((resolve) => setImmediate(resolve));
}

describe('the end of a response no route took (`unrouted`)', () => {
  it('is served as written, without the key echo, and not stored: the key is released (no-route) before the end leaves', async () => {
    const store = networkLike();
    const release = store.release;
    const endedAtRelease: boolean[] = [];
    let last: { ended: () => boolean } | undefined;
    store.release = (input) => {
      endedAtRelease.push(last?.ended() ?? true);
      return release(input);
    };
    const { post, events, runs, close } = await serveRoutes(store, {
      answer: (res) => {
        last = { ended: () => res.writableEnded };
        res.statusCode = 404;
        res.end('no such route');
      },
    });
    try {
      expect(await post('/refunds', 'nr-1')).toEqual({ status: 404, key: null, replayed: null, body: 'no such route' });
      // Sent the moment the 404 arrived: the key is free, so the request runs again.
      expect(await post('/refunds', 'nr-1')).toEqual({ status: 404, key: null, replayed: null, body: 'no such route' });
      expect(runs()).toBe(2);
      // The store (which answers later) released the key while the 404 had not ended yet.
      expect(endedAtRelease).toEqual([false, false]);
      expect(events.filter((event) => event.type === 'response-not-stored')).toMatchObject([
        { reason: 'no-route', status: 404 },
        { reason: 'no-route', status: 404 },
      ]);
      // A routed answer is stored and replayed as ever, echo and all.
      expect(await post('/charges', 'ch-1')).toEqual({
        status: 201,
        key: 'ch-1',
        replayed: null,
        body: '{"id":"ch_1"}',
      });
      expect((await post('/charges', 'ch-1')).replayed).toBe('true');
    } finally {
      await close();
    }
  });

  it('held (transactional): a 404 written in pieces goes out whole once the transaction rolled back, without the echo', async () => {
    const { post, events, runs, close } = await serveRoutes(transactionalMemoryStore(), {
      hold: true,
      answer: (res) => {
        res.statusCode = 404;
        res.write('no such ');
        res.end('route');
      },
    });
    try {
      expect(await post('/refunds', 'tx-1')).toEqual({ status: 404, key: null, replayed: null, body: 'no such route' });
      expect(await post('/refunds', 'tx-1')).toEqual({ status: 404, key: null, replayed: null, body: 'no such route' });
      expect(runs()).toBe(2);
      expect(events.filter((event) => event.type === 'response-not-stored')).toMatchObject([
        { reason: 'no-route', status: 404 },
        { reason: 'no-route', status: 404 },
      ]);
    } finally {
      await close();
    }
  });

  it('held (transactional): a response destroyed before its head rolls the transaction back at once, and the key is free', async () => {
    const { post, events, runs, close } = await serveRoutes(transactionalMemoryStore(), {
      hold: true,
      // An hour: only a capture that gives up at once frees the key within the test.
      lease: '1h',
      answer: (res) => res.destroy(),
    });
    try {
      await expect(post('/destroyed', 'tx-gone')).rejects.toThrow();
      await waitFor(() => events.some((event) => event.type === 'release'));
      expect(events.filter((event) => event.type === 'response-not-stored')).toMatchObject([{ reason: 'closed' }]);
      await expect(post('/destroyed', 'tx-gone')).rejects.toThrow();
      expect(runs()).toBe(2);
    } finally {
      await close();
    }
  });

  it('a client that left before the head: the handler still ends the response, leases later, and its outcome is stored', async () => {
    let started!: () => void;
    const running = new Promise<void>((resolve) => {
      started = resolve;
    });
    const { post, events, runs, close } = await serveRoutes(memoryStore(), {
      // Long enough that a busy 2-core box (a CI run's parallel workers) cannot stall the heartbeat
      // past a lease: with 100 ms, a 70 ms stall let the lease lapse and the test hang.
      lease: '400ms',
      answer: (res) => {
        started();
        // Still working when the client leaves, and for three leases after: the heartbeat renews.
        res.once('close', () =>
          setTimeout(() => {
            res.statusCode = 201;
            res.end('late');
          }, 1_200),
        );
      },
    });
    try {
      await expect(post('/slow', 'gone-1', running)).rejects.toThrow();
      // Settled either way; a lost lease or a release fails at the next line instead of hanging.
      await waitFor(() => events.some((event) => ['complete', 'release', 'lease-lost'].includes(event.type)));
      expect(events.map((event) => event.type)).toContain('complete');
      expect(await post('/slow', 'gone-1')).toMatchObject({ status: 201, replayed: 'true', body: 'late' });
      expect(runs()).toBe(1);
      expect(events.some((event) => event.type === 'response-not-stored')).toBe(false);
    } finally {
      await close();
    }
  });

  it('`echo` puts the key back on an answer whose headers were all removed (Koa errors), never on an unrouted one', async () => {
    // Like Koa's error handler: every header removed, then the error's status and text.
    const clearing = (status: number) => (res: ServerResponse) => {
      for (const name of res.getHeaderNames()) res.removeHeader(name);
      res.statusCode = status;
      res.setHeader('content-type', 'text/plain');
      res.end('failed');
    };
    for (const hold of [false, true]) {
      const store = hold ? transactionalMemoryStore() : memoryStore();
      const failing = await serveRoutes(store, { hold, echo: true, answer: clearing(409) });
      try {
        expect(await failing.post('/conflict', `e-${hold}`)).toMatchObject({ status: 409, key: `e-${hold}` });
      } finally {
        await failing.close();
      }
      const unrouted = await serveRoutes(store, { hold, echo: true, answer: clearing(404) });
      try {
        expect(await unrouted.post('/nowhere', `u-${hold}`)).toMatchObject({ status: 404, key: null, replayed: null });
      } finally {
        await unrouted.close();
      }
    }
  });
});
