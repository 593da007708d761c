import type { ServerResponse } from 'node:http';
import { gunzipSync, gzipSync } from 'node:zlib';
import { transactionalMemoryStore } from '@idem/testkit';
import { describe, expect, it } from 'vitest';
import type { Duration } from '../src/duration.js';
import { memoryStore } from '../src/memory-store.js';
import type { Store } from '../src/store.js';
import { networkLike, type Received, serve, waitFor } from './capture-server.js';

// What the held-end tests read of an answer: its body as a client that takes gzip reads it.
const brief = (answer: Received) => ({
  status: answer.status,
  replayed: answer.headers['idempotent-replayed'] ?? null,
  encoding: answer.headers['content-encoding'] ?? null,
  body: (answer.headers['content-encoding'] === 'gzip' ? gunzipSync(answer.body) : answer.body).toString(),
});

// The capture server (capture-server.ts) with a handler that answers 201 in one `end`, or what
// `answer` writes. `endedAtOnce` records, per first execution, whether the end had gone out when
// `answer` returned. `below` wraps the response before the capture does, as a layer mounted earlier
// (compression()) would.
async function serveCharges(
  store: Store,
  answer = (res: ServerResponse, run: number) => {
    res.statusCode = 201;
    res.end(`{"run":${run}}`);
  },
  below?: (res: ServerResponse) => void,
) {
  const endedAtOnce: boolean[] = [];
  const served = await serve({
    store,
    replayHeaders: ['x-charge-version'],
    ...(below === undefined ? {} : { below }),
    answer: (res, run) => {
      answer(res, run);
      endedAtOnce.push(res.writableEnded);
    },
  });
  return {
    post: async (key: string) => brief(await served.post(key)),
    headersOf: async (key: string) => (await served.post(key)).headers,
    endedAtOnce,
    close: served.close,
  };
}

describe('the held end of a captured response', () => {
  it('goes out within `end` when the store answers at once (memoryStore), with the outcome already stored', async () => {
    const { post, endedAtOnce, close } = await serveCharges(memoryStore());
    try {
      expect(await post('k-1')).toEqual({ status: 201, replayed: null, encoding: null, body: '{"run":1}' });
      expect(await post('k-1')).toEqual({ status: 201, replayed: 'true', encoding: null, body: '{"run":1}' });
      expect(endedAtOnce).toEqual([true]);
    } finally {
      await close();
    }
  });

  it('waits for a store that answers later, and the retry still replays', async () => {
    const { post, endedAtOnce, close } = await serveCharges(networkLike());
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
      const { post, close } = await serveCharges(store, lengthOnly);
      try {
        expect(await post('cl-1')).toEqual({ status: 201, replayed: null, encoding: null, body: body(1) });
        expect(await post('cl-1')).toEqual({ status: 201, replayed: 'true', encoding: null, body: body(1) });
      } finally {
        await close();
      }
    }
  });

  it('an `end` (or a write) after the last declared byte follows that byte, which waits for the outcome', async () => {
    const { post, close } = await serveCharges(networkLike(), (res, run) => {
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
    const { headersOf, close } = await serveCharges(memoryStore(), (res, run) => {
      res
        .writeHead(201, { 'content-type': 'application/json', 'x-charge-version': '7', 'x-request-id': 'r-1' })
        .end(`{"run":${run}}`);
    });
    try {
      expect((await headersOf('h-1'))['x-request-id']).toBe('r-1');
      const again = await headersOf('h-1');
      expect(again['idempotent-replayed']).toBe('true');
      expect(again['content-type']).toBe('application/json');
      expect(again['x-charge-version']).toBe('7');
      expect(again['x-request-id']).toBeUndefined();
    } finally {
      await close();
    }
  });

  it('keeps a header repeated in a flat writeHead array (two Link fields) as one list', async () => {
    const { headersOf, close } = await serveCharges(memoryStore(), (res, run) => {
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
      expect(again['idempotent-replayed']).toBe('true');
      expect(again.link).toBe('</p/2>; rel="next", </p/9>; rel="last"');
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
    const { post, close } = await serveCharges(
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

// The capture server with a handler that answers 201 on /charges and, elsewhere, what `answer`
// writes (by default a 404 in one `end`), as a framework's not-found answer: the capture is told with
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
  const served = await serve({
    store,
    hold,
    echo,
    ...(lease === undefined ? {} : { lease }),
    unrouted: (res, path) => path !== '/charges' && res.statusCode === 404,
    answer: (res, _run, _capture, _context, path) => {
      if (path === '/charges') {
        res.statusCode = 201;
        res.end('{"id":"ch_1"}');
      } else if (answer) answer(res);
      else {
        res.statusCode = 404;
        res.end('no such route');
      }
    },
  });
  // With `leaveOnce`, the client leaves once it resolves (the post then rejects).
  const post = async (path: string, key: string, leaveOnce?: Promise<void>) => {
    const answer = await served.post(key, path, leaveOnce);
    return {
      status: answer.status,
      key: answer.headers['idempotency-key'] ?? null,
      replayed: answer.headers['idempotent-replayed'] ?? null,
      body: answer.body.toString(),
    };
  };
  return { post, events: served.events, runs: served.runs, close: served.close };
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
