// Audit: what the server's own timeouts, and a koa-timeout-style middleware racing the handler, do
// to the key, the stored outcome and the side effect, over real sockets, on the memory store and on
// Redis. The right behaviour: exactly one effect, and the key's retries end up with the handler's
// real outcome; a timeout answer written while the handler still runs must never become the key's
// stored outcome.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Store } from '@idem/core';
import { idempotency } from '@idem/koa';
import { frameRequest, sendRaw } from '@idem/testkit';
import Koa, { type Middleware } from 'koa';
import { describe, expect, it } from 'vitest';
import {
  gate,
  listen,
  post,
  retryPast409,
  type StoreBackend,
  timeoutBackends,
  until,
} from '../../core/test/support/timeouts-kit.js';

const backends: StoreBackend[] = await timeoutBackends('koa');

// What koa-timeout and koa-timeout-v2 do: race the rest of the chain against a timer and, when the
// timer wins, throw a 503 that Koa's error handler answers, while the handler goes on.
function koaTimeout(ms: number): Middleware {
  return async (ctx, next) => {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => {
        ctx.state.timedout = true;
        reject(Object.assign(new Error('Request timeout'), { status: 503, expose: true }));
      }, ms);
    });
    try {
      await Promise.race([next(), timedOut]);
    } finally {
      clearTimeout(timer);
    }
  };
}

interface StartOptions {
  before?: Middleware[];
  configure?: (server: http.Server) => void;
  server?: http.ServerOptions;
}

async function start(store: Store, options: StartOptions) {
  const effects = { started: 0, finished: 0 };
  const provider = gate();
  const app = new Koa();
  // Koa logs every error it answers; these are expected.
  app.silent = true;
  app.use(async (ctx, next) => {
    ctx.state.auth = { sub: 'user-1', iss: 'https://issuer.test' } as never;
    await next();
  });
  for (const middleware of options.before ?? []) app.use(middleware);
  app.use(idempotency({ store, storeTimeout: '15s' }));
  // The route, as the one handler of the app: the operation is the path.
  app.use(async (ctx) => {
    const id = `ch_${++effects.started}`;
    await provider.promise;
    effects.finished++;
    ctx.status = 201;
    ctx.body = { id };
  });
  const server = http.createServer(options.server ?? {}, app.callback());
  options.configure?.(server);
  const listening = await listen(server);
  return { ...listening, url: `${listening.url}/charges`, server, effects, provider };
}

describe.each(backends)('Koa on $name: server timeouts around idempotency()', (backend) => {
  it('HELD: server.timeout cuts the socket mid-handler; the handler finishes, its outcome is stored and replayed', async () => {
    const app = await start(backend.store(), { configure: (server) => server.setTimeout(300) });
    try {
      expect((await post(app.url, 'socket-timeout')).status).toBe(0);
      expect((await post(app.url, 'socket-timeout')).status).toBe(409);
      app.provider.open();
      await until(() => app.effects.finished === 1);
      const retry = await retryPast409(app.url, 'socket-timeout');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
      expect(app.effects.started).toBe(1);
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  it('HELD: server.requestTimeout cuts a body mid-upload; nothing is claimed, the retry runs once', async () => {
    const app = await start(backend.store(), {
      server: { requestTimeout: 400, headersTimeout: 300, connectionsCheckingInterval: 50 },
    });
    app.provider.open();
    try {
      const { port } = app.server.address() as AddressInfo;
      const framed = frameRequest(
        'POST /charges HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: request-timeout\r\n',
        Buffer.from(JSON.stringify({ amount: 100 })),
      );
      const cut = await sendRaw(port, framed.bytes, framed.headEnd + 5, undefined, 8_000);
      expect(cut.timedOut).toBe(false);
      expect(cut.status).toBe(408);
      expect(app.effects.started).toBe(0);
      const retry = await post(app.url, 'request-timeout');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(app.effects.started).toBe(1);
    } finally {
      await app.close();
    }
  });

  // Was wrong: the timeout's 503 is written by Koa's error handler on the response the capture
  // watches, while idempotency()'s own `await next()` is still pending: it is settled as the key's
  // outcome (stored under the default policy) and replayed to every retry for the retention,
  // though the handler then made its effect. The adapter could tell (the response ended before
  // next() settled), but what to store then is a decision: the handler's answer can no longer be
  // written, and Koa ignores the status it sets after the head went out. Options: hold the key
  // until next() settles and store a `response_not_replayable` under the handler's status, or
  // document that a timeout middleware that answers must be mounted inside idempotency(), never
  // around it (see docs/guides/koa.md).
  it.fails('koa-timeout around idempotency(): the 503 is not stored; the retry gets 409, then the real 201', async () => {
    const app = await start(backend.store(), { before: [koaTimeout(300)] });
    try {
      expect((await post(app.url, 'koa-timeout')).status).toBe(503);
      expect(app.effects.started).toBe(1);
      const during = await post(app.url, 'koa-timeout');
      app.provider.open();
      await until(() => app.effects.finished === 1);
      const retry = await retryPast409(app.url, 'koa-timeout');
      expect(app.effects.started).toBe(1);
      expect(during.status).toBe(409);
      expect(retry.status).toBe(201);
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  // Was wrong: mounted inside idempotency(), the timer's 503 is thrown through its `await next()`,
  // so the adapter takes it for the handler's own failure: stored under the default policy and
  // replayed for the retention (under 'stripe', released: the retry charges again), while the
  // handler goes on and makes its effect. Nothing tells the adapter that the handler still runs.
  // Decision needed with the one above; until then the docs say to give the handler the lease's
  // signal or `maxExecution` rather than race it.
  it.fails('koa-timeout inside idempotency(): the retry ends up with the real 201, one effect', async () => {
    const store = backend.store();
    const effects = { started: 0, finished: 0 };
    const provider = gate();
    const app = new Koa();
    app.silent = true;
    app.use(async (ctx, next) => {
      ctx.state.auth = { sub: 'user-1', iss: 'https://issuer.test' } as never;
      await next();
    });
    app.use(idempotency({ store, storeTimeout: '15s' }));
    app.use(koaTimeout(300));
    app.use(async (ctx) => {
      const id = `ch_${++effects.started}`;
      await provider.promise;
      effects.finished++;
      ctx.status = 201;
      ctx.body = { id };
    });
    const listening = await listen(http.createServer(app.callback()));
    try {
      expect((await post(listening.url, 'inner-timeout')).status).toBe(503);
      provider.open();
      await until(() => effects.finished === 1);
      const retry = await retryPast409(listening.url, 'inner-timeout');
      expect(effects.started).toBe(1);
      expect(retry.status).toBe(201);
    } finally {
      provider.open();
      await listening.close();
    }
  });
});
