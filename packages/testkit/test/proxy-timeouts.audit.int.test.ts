// Audit: a reverse proxy in front of the origin gives up before the handler answers (nginx's
// `proxy_read_timeout`). It answers 504 and closes its connection to the origin, whose handler goes
// on; or, with `proxy_next_upstream timeout non_idempotent`, it sends the same request to a second
// origin on the same store. The client retries with the same key, through the proxy, while the
// first run still goes and after it finished. On every adapter, on the memory store and on Redis:
// exactly one effect, the proxy's 504 is never the key's outcome, and the retries end up with the
// handler's own answer.
import http from 'node:http';
import { createClient } from '@idem/client';
import type { IdempotencyOptions, Store } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import {
  gate,
  listen,
  post,
  retryPast409,
  type StoreBackend,
  timeoutBackends,
  timeoutProxy,
  until,
} from '../../core/test/support/timeouts-kit.js';

const backends: StoreBackend[] = await timeoutBackends('proxy');

/** What every origin's POST /charges shares: its effects, and the gate its provider waits on. */
interface Shared {
  /** Requests the origins received, counted as they arrive (before the idempotency layer). */
  arrived: number;
  started: number;
  finished: number;
  provider: ReturnType<typeof gate>;
}

interface Origin {
  url: string;
  close: () => Promise<void>;
}

const caller = { sub: 'user-1', iss: 'https://issuer.test' };
const storeTimeout = '15s';

// The charge: an effect, then a wait for the provider, then the handler's own answer.
async function charge(shared: Shared): Promise<{ id: string }> {
  const id = `ch_${++shared.started}`;
  await shared.provider.promise;
  shared.finished++;
  return { id };
}

/** Counts the requests `server` receives in `shared.arrived`. */
function counted(server: http.Server, shared: Shared): http.Server {
  server.on('request', () => shared.arrived++);
  return server;
}

type Extra = Partial<Pick<IdempotencyOptions, 'wait'>>;

const origins: Record<string, (store: Store, shared: Shared, extra?: Extra) => Promise<Origin>> = {
  express: async (store, shared, extra = {}) => {
    const app = express();
    app.use((req, _res, next) => {
      (req as { auth?: unknown }).auth = caller;
      next();
    });
    app.use(expressIdempotency({ store, storeTimeout, ...extra }));
    app.use(express.json());
    app.post('/charges', async (_req, res) => {
      res.status(201).json(await charge(shared));
    });
    app.use(idempotencyErrors());
    return listen(counted(http.createServer(app), shared));
  },
  fastify: async (store, shared, extra = {}) => {
    const app = Fastify();
    app.addHook('onRequest', async (request) => {
      (request as { auth?: unknown }).auth = caller;
    });
    await app.register(fastifyIdempotency, { store, storeTimeout, ...extra });
    app.post('/charges', async (_request, reply) => reply.code(201).send(await charge(shared)));
    counted(app.server, shared);
    await app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = app.server.address() as { port: number };
    return { url: `http://127.0.0.1:${port}`, close: () => app.close() };
  },
  koa: async (store, shared, extra = {}) => {
    const app = new Koa();
    app.use(async (ctx, next) => {
      ctx.state.auth = caller as never;
      await next();
    });
    app.use(koaIdempotency({ store, storeTimeout, ...extra }));
    app.use(async (ctx) => {
      const body = await charge(shared);
      ctx.status = 201;
      ctx.body = body;
    });
    return listen(counted(http.createServer(app.callback()), shared));
  },
};

const frameworks = Object.keys(origins).flatMap((framework) =>
  backends.map((backend) => ({ framework, backend, name: `${framework} on ${backend.name}` })),
);

describe.each(frameworks)('a proxy that times out in front of $name', ({ framework, backend }) => {
  const makeOrigin = origins[framework] as (store: Store, shared: Shared, extra?: Extra) => Promise<Origin>;

  it('the proxy answers 504 and hangs up; the retry gets 409 while the handler runs, then its 201, one effect', async () => {
    const shared: Shared = { arrived: 0, started: 0, finished: 0, provider: gate() };
    const origin = await makeOrigin(backend.store(), shared);
    const proxy = await timeoutProxy({ upstreams: [origin.url] });
    const url = `${proxy.url}/charges`;
    try {
      const answered = post(url, 'proxy-504');
      // The proxy's timeout comes while the handler runs.
      await until(() => shared.started === 1);
      proxy.timeOut();
      const first = await answered;
      expect(first.status).toBe(504);
      expect(shared.started).toBe(1);
      // The origin's handler still runs: the retry is told so, not handed the proxy's 504.
      const during = await post(url, 'proxy-504');
      expect(during.status).toBe(409);
      expect(during.headers['retry-after']).toBeDefined();
      shared.provider.open();
      await until(() => shared.finished === 1);
      const retry = await retryPast409(url, 'proxy-504');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
      expect(shared.started).toBe(1);
    } finally {
      shared.provider.open();
      await proxy.close();
      await origin.close();
    }
  });

  it('proxy_next_upstream sends the same request to a second origin on the same store: it gets 409, never a second run', async () => {
    const shared: Shared = { arrived: 0, started: 0, finished: 0, provider: gate() };
    const store = backend.store();
    const first = await makeOrigin(store, shared);
    const second = await makeOrigin(store, shared);
    const proxy = await timeoutProxy({ upstreams: [first.url, second.url], nextUpstream: true });
    const url = `${proxy.url}/charges`;
    try {
      const answered = post(url, 'next-upstream');
      await until(() => shared.started === 1);
      proxy.timeOut();
      const answer = await answered;
      // The second origin found the key in progress and said so, before any timeout of the proxy.
      expect(proxy.sent()).toEqual([1, 1]);
      expect(answer.status).toBe(409);
      expect(shared.started).toBe(1);
      shared.provider.open();
      await until(() => shared.finished === 1);
      const retry = await retryPast409(url, 'next-upstream');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
      expect(shared.started).toBe(1);
    } finally {
      shared.provider.open();
      await proxy.close();
      await first.close();
      await second.close();
    }
  });

  it('a retry that waits at the origin (`wait`) and is cut by the proxy too runs nothing; the next retry replays', async () => {
    const shared: Shared = { arrived: 0, started: 0, finished: 0, provider: gate() };
    const origin = await makeOrigin(backend.store(), shared, { wait: '5s' });
    const proxy = await timeoutProxy({ upstreams: [origin.url] });
    const url = `${proxy.url}/charges`;
    try {
      const answered = post(url, 'waiting');
      await until(() => shared.started === 1);
      proxy.timeOut();
      expect((await answered).status).toBe(504);
      // This one waits at the origin for the first run, longer than the proxy gives it.
      const waited = post(url, 'waiting');
      await until(() => shared.arrived === 2);
      proxy.timeOut();
      expect((await waited).status).toBe(504);
      shared.provider.open();
      await until(() => shared.finished === 1);
      const retry = await retryPast409(url, 'waiting');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
      expect(shared.started).toBe(1);
    } finally {
      shared.provider.open();
      await proxy.close();
      await origin.close();
    }
  });

  it("@idem/client through the proxy: 504, then 409 while the handler runs, then the handler's 201 replayed, one effect", async () => {
    const shared: Shared = { arrived: 0, started: 0, finished: 0, provider: gate() };
    const origin = await makeOrigin(backend.store(), shared);
    const proxy = await timeoutProxy({ upstreams: [origin.url] });
    // The proxy's timeout comes while the handler of the client's first attempt runs.
    void until(() => shared.started === 1).then(proxy.timeOut);
    let waits = 0;
    const api = createClient({
      baseUrl: proxy.url,
      retry: { maxAttempts: 6, deadline: '30s' },
      // The client's waits, shortened; after the 409 the provider answers and the run finishes.
      sleep: async () => {
        if (++waits === 2) {
          shared.provider.open();
          await until(() => shared.finished === 1);
        }
      },
    });
    try {
      const result = await api.post<{ id: string }>('/charges', { amount: 100 });
      const statuses = result.attempts.map((attempt) => attempt.status);
      // A 409 more when the retry came between the handler's end and the store's answer.
      expect(statuses[0]).toBe(504);
      expect(statuses.slice(1, -1).every((status) => status === 409)).toBe(true);
      expect(statuses.slice(1, -1).length).toBeGreaterThanOrEqual(1);
      expect(statuses.at(-1)).toBe(201);
      expect(result.status).toBe(201);
      expect(result.replayed).toBe(true);
      expect(result.body).toEqual({ id: 'ch_1' });
      expect(shared.started).toBe(1);
    } finally {
      shared.provider.open();
      await proxy.close();
      await origin.close();
    }
  });
});
