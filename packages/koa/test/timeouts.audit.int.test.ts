// Audit: what the server's own timeouts, and a koa-timeout-style middleware racing the handler, do
// to the key, the stored outcome and the side effect, over real sockets, on the memory store and on
// Redis. The right behaviour: exactly one effect, and the key's retries end up with the handler's
// real outcome; a timeout answer written while the handler still runs must never become the key's
// stored outcome.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent, Store } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa, { type Middleware } from 'koa';
import { describe, expect, it } from 'vitest';
import {
  gate,
  itServerTimeouts,
  listen,
  post,
  retryPast409,
  type StoreBackend,
  timeoutBackends,
  until,
} from '../../core/test/support/timeouts-kit.js';
import { koaTimeout } from './support/koa-timeout.js';

const backends: StoreBackend[] = await timeoutBackends('koa');

interface StartOptions {
  before?: Middleware[];
  storeOutcome?: 'all' | 'stripe' | 'success' | (() => boolean);
  /** The handler says it had no effect (`release()`) once it is let go. */
  releases?: boolean;
  /** The handler throws once it is let go, instead of answering 201. */
  throws?: boolean;
  configure?: (server: http.Server) => void;
  server?: http.ServerOptions;
}

async function start(store: Store, options: StartOptions) {
  const effects = { started: 0, finished: 0 };
  const provider = gate();
  const events: IdempotencyEvent[] = [];
  const app = new Koa();
  // Koa logs every error it answers; these are expected.
  app.silent = true;
  app.use(async (ctx, next) => {
    ctx.state.auth = { sub: 'user-1', iss: 'https://issuer.test' } as never;
    await next();
  });
  for (const middleware of options.before ?? []) app.use(middleware);
  app.use(
    idempotency({
      store,
      storeTimeout: '15s',
      storeOutcome: options.storeOutcome ?? 'all',
      onEvent: (event) => events.push(event),
    }),
  );
  // The route, as the one handler of the app: the operation is the path.
  app.use(async (ctx) => {
    const id = `ch_${++effects.started}`;
    await provider.promise;
    effects.finished++;
    if (options.throws) throw new Error('the provider failed');
    if (options.releases) ctx.state.idempotency?.release();
    ctx.status = 201;
    ctx.body = { id };
  });
  const server = http.createServer(options.server ?? {}, app.callback());
  options.configure?.(server);
  const listening = await listen(server);
  const { port } = server.address() as AddressInfo;
  return { ...listening, url: `${listening.url}/charges`, port, server, effects, provider, events };
}

describe.each(backends)('Koa on $name: server timeouts around idempotency()', (backend) => {
  itServerTimeouts(backend, {
    idle: 'server.timeout',
    request: 'server.requestTimeout',
    idleApp: (store, ms) => start(store, { configure: (server) => server.setTimeout(ms) }),
    requestApp: (store) =>
      start(store, { server: { requestTimeout: 400, headersTimeout: 300, connectionsCheckingInterval: 50 } }),
  });

  // Was wrong (fixed): the timeout's 503, written by Koa's error handler while idempotency()'s own
  // `await next()` was still pending, was settled as the key's outcome (stored and replayed for the
  // retention under the default policy; under 'stripe' or 'success' the key released, and the retry
  // ran the handler a second time). Now the 503 goes out unstored, the key stays held while the
  // handler runs (409), and once it ended the key keeps `500 response_not_replayable` whatever the
  // policy says: the operation ran, and its own answer could never be written.
  it.each([
    ['all', 'all'],
    ['stripe', 'stripe'],
    ['success', 'success'],
    ['a function that releases every outcome', () => false],
  ] as const)(
    'koa-timeout around idempotency() (storeOutcome %s): the 503 is not stored; 409 while the handler runs, then the replayed 500 response_not_replayable, one effect',
    async (name, storeOutcome) => {
      const app = await start(backend.store(), { before: [koaTimeout(300)], storeOutcome });
      const key = `koa-timeout-${name.replaceAll(' ', '-')}`;
      try {
        const first = await post(app.url, key);
        expect(first.status).toBe(503);
        expect(first.headers['idempotent-replayed']).toBeUndefined();
        expect(app.effects.started).toBe(1);
        const during = await post(app.url, key);
        expect(during.status).toBe(409);
        app.provider.open();
        await until(() => app.effects.finished === 1);
        const retry = await retryPast409(app.url, key);
        expect(retry.status).toBe(500);
        expect(retry.headers['idempotent-replayed']).toBe('true');
        expect(JSON.parse(retry.body)).toMatchObject({ code: 'response_not_replayable' });
        expect(app.effects.started).toBe(1);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );

  it.each(['stripe', 'success'] as const)(
    "koa-timeout around idempotency(), storeOutcome '%s', the handler then throws: held while it runs, released only after it ended",
    async (storeOutcome) => {
      const app = await start(backend.store(), { before: [koaTimeout(300)], storeOutcome, throws: true });
      const key = `koa-timeout-throws-${storeOutcome}`;
      try {
        expect((await post(app.url, key)).status).toBe(503);
        // Never released while the handler runs: no second execution alongside the first.
        expect((await post(app.url, key)).status).toBe(409);
        expect(app.effects.started).toBe(1);
        app.provider.open();
        await until(() => app.effects.finished === 1);
        // The handler threw, which the policy reads as a crash before any effect: the retry runs.
        const retry = await retryPast409(app.url, key);
        expect(retry.status).toBe(500);
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        expect(app.effects.started).toBe(2);
      } finally {
        app.provider.open();
        await app.close();
      }
    },
  );

  it("koa-timeout around idempotency(), storeOutcome 'all', the handler then throws: still kept with response_not_replayable", async () => {
    const app = await start(backend.store(), { before: [koaTimeout(300)], throws: true });
    try {
      expect((await post(app.url, 'koa-timeout-throws-all')).status).toBe(503);
      app.provider.open();
      await until(() => app.effects.finished === 1);
      const retry = await retryPast409(app.url, 'koa-timeout-throws-all');
      expect(retry.status).toBe(500);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body)).toMatchObject({ code: 'response_not_replayable' });
      expect(app.effects.started).toBe(1);
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  it('koa-timeout around idempotency(), the handler then says it had no effect (release()): held while it runs, released once it ended', async () => {
    const app = await start(backend.store(), { before: [koaTimeout(300)], releases: true });
    try {
      expect((await post(app.url, 'koa-timeout-release')).status).toBe(503);
      expect((await post(app.url, 'koa-timeout-release')).status).toBe(409);
      app.provider.open();
      await until(() => app.effects.finished === 1);
      // Let go once more: the retry runs the handler, which answers 201 this time (no timeout race
      // lost: it is let go at once).
      const retry = await retryPast409(app.url, 'koa-timeout-release');
      expect(app.effects.started).toBe(2);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
    } finally {
      app.provider.open();
      await app.close();
    }
  });

  it('a handler that takes the response over (ctx.respond = false) and ends it before returning: its 201 is the stored outcome', async () => {
    const store = backend.store();
    const app = new Koa();
    let started = 0;
    app.use(async (ctx, next) => {
      ctx.state.auth = { sub: 'user-1', iss: 'https://issuer.test' } as never;
      await next();
    });
    app.use(idempotency({ store, storeTimeout: '15s' }));
    app.use(async (ctx) => {
      started++;
      ctx.respond = false;
      ctx.res.writeHead(201, { 'content-type': 'application/json' });
      ctx.res.end(JSON.stringify({ id: `ch_${started}` }));
      // Still working after its answer went out (a log flushed): its own end all the same.
      await new Promise((resolve) => setTimeout(resolve, 50));
    });
    const listening = await listen(http.createServer(app.callback()));
    try {
      expect((await post(listening.url, 'took-over')).status).toBe(201);
      const retry = await retryPast409(listening.url, 'took-over');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body)).toEqual({ id: 'ch_1' });
      expect(started).toBe(1);
    } finally {
      await listening.close();
    }
  });

  // Was wrong, and stays a documented limit: mounted inside idempotency(), the timer's 503 is thrown
  // through its `await next()`, so `next()` has settled (rejected) and the adapter takes it for the
  // handler's own failure: stored under the default policy and replayed for the retention (under
  // 'stripe', released: the retry charges again), while the handler goes on and makes its effect.
  // Nothing tells the adapter that the handler still runs (the racing middleware's error has no
  // common shape). docs/concepts.md "Timeouts around the handler" says to mount such a timeout
  // outside idempotency(), where it is handled. Decided: a timeout of the app's own says so,
  // `ctx.state.idempotency.answeringForHandler()` before it throws (testkit's
  // answering-for-handler.int.test.ts); koa-timeout, which cannot, stays this documented limit.
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
