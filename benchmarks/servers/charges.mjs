// POST /charges on Express, Fastify or Koa: the bare route, the route behind idem on a store, or, on
// Express, behind a peer library. The handler is the same everywhere: a 201 with a small JSON charge.
import { randomUUID } from 'node:crypto';
import { deleteRedisKeys, idemStore, ioredisClient, redisUrl } from './backends.mjs';
import { calibrationExpress, calibrationFastify, calibrationKoa } from './calibration-layer.mjs';
import { minimalExpress, minimalFastify, minimalKoa } from './minimal-layer.mjs';

let count = 0;
const charge = (body) => ({ id: `ch_${++count}`, amount: body?.amount ?? 0, currency: 'usd', status: 'succeeded' });

// idem's scope is normally the principal the guard attached; these routes have no guard, so every
// request is one fixed caller (a scope function is what the adapters ask for in that case).
const benchScope = () => 'bench-caller';

/**
 * Builds and starts the app of `spec` on an ephemeral loopback port.
 * `spec`: `{ framework: 'express'|'fastify'|'koa', variant: 'bare'|'idem'|'minimal'|'calibration'|'express-idempotency'|'node-idempotency', store, keyPrefix, spinMicros, replayCache }`
 * (`spinMicros`: the busy work per request of the 'calibration' variant; `replayCache`: the idem
 * variant's `replayCache.ttl`, off when absent).
 *
 * @example
 * const { port, close } = await startCharges({ framework: 'koa', variant: 'idem', store: 'memory' });
 */
export async function startCharges(spec) {
  const cleanups = [];
  let middleware;
  if (spec.variant === 'idem') {
    const { store, close } = await idemStore(spec.store);
    cleanups.push(close);
    const cache = spec.replayCache === undefined ? {} : { replayCache: { ttl: spec.replayCache } };
    middleware = await idemMiddleware(spec.framework, { store, scope: benchScope, ...cache });
  } else if (spec.variant === 'express-idempotency') {
    middleware = await expressIdempotency(spec, cleanups);
  } else if (spec.variant === 'node-idempotency') {
    middleware = await nodeIdempotency(spec, cleanups);
  } else if (spec.variant === 'minimal') {
    middleware = minimalLayer(spec.framework);
  } else if (spec.variant === 'calibration') {
    middleware = calibrationLayer(spec.framework, spec.spinMicros);
  } else if (spec.variant !== 'bare') {
    throw new TypeError(`unknown variant ${spec.variant}`);
  }
  // idem goes where the Express guide and the examples put it, before the body parser (it hashes
  // the raw bytes and hands them on), and so do the yardsticks measured beside it; the peers stay
  // after the parser, as their usage has them (they read req.body).
  const afterParser = spec.variant === 'express-idempotency' || spec.variant === 'node-idempotency';
  const server = await listen(spec.framework, middleware, afterParser);
  return {
    port: server.port,
    close: async () => {
      await server.close();
      for (const cleanup of cleanups) await cleanup();
    },
  };
}

async function idemMiddleware(framework, options) {
  if (framework === 'express') return { express: (await import('@idem/express')).idempotency(options) };
  if (framework === 'fastify') return { fastifyPlugin: (await import('@idem/fastify')).idempotency, options };
  return { koa: (await import('@idem/koa')).idempotency(options) };
}

// The yardstick of servers/minimal-layer.mjs, mounted where idem is.
function minimalLayer(framework) {
  if (framework === 'express') return { express: minimalExpress() };
  if (framework === 'fastify') return { fastifyPlugin: minimalFastify, options: {} };
  return { koa: minimalKoa() };
}

// The known cost of servers/calibration-layer.mjs, mounted where idem is.
function calibrationLayer(framework, micros) {
  if (!(Number.isFinite(micros) && micros > 0)) throw new TypeError('the calibration variant needs spinMicros > 0');
  if (framework === 'express') return { express: calibrationExpress(micros) };
  if (framework === 'fastify') return { fastifyPlugin: calibrationFastify, options: { micros } };
  return { koa: calibrationKoa(micros) };
}

async function listen(framework, middleware, afterParser) {
  if (framework === 'express') {
    const express = (await import('express')).default;
    const app = express();
    const layer = middleware?.express;
    const handlers = [];
    if (layer && !afterParser) handlers.push(layer);
    handlers.push(express.json());
    if (layer && afterParser) handlers.push(layer);
    handlers.push((req, res) => {
      // express-idempotency calls next() after it has answered a replay itself.
      if (res.headersSent) return;
      res.status(201).json(charge(req.body));
    });
    app.post('/charges', ...handlers);
    return nodeServer(app.listen(0, '127.0.0.1'));
  }
  if (framework === 'fastify') {
    const Fastify = (await import('fastify')).default;
    const app = Fastify();
    if (middleware?.fastifyPlugin) await app.register(middleware.fastifyPlugin, middleware.options);
    app.post('/charges', async (request, reply) => reply.code(201).send(charge(request.body)));
    await app.listen({ port: 0, host: '127.0.0.1' });
    return { port: app.server.address().port, close: () => app.close() };
  }
  if (framework === 'koa') {
    const Koa = (await import('koa')).default;
    const { json } = await import('node:stream/consumers');
    const app = new Koa();
    if (middleware?.koa) app.use(middleware.koa);
    app.use(async (ctx) => {
      if (ctx.method !== 'POST' || ctx.path !== '/charges') return;
      const body = await json(ctx.req);
      ctx.status = 201;
      ctx.body = charge(body);
    });
    return nodeServer(app.listen(0, '127.0.0.1'));
  }
  throw new TypeError(`unknown framework ${framework}`);
}

/**
 * A started node:http server as `{ port, close }`, once it listens.
 *
 * @example
 * const { port, close } = await nodeServer(app.listen(0, '127.0.0.1'));
 */
export async function nodeServer(server) {
  await new Promise((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  return {
    port: server.address().port,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// express-idempotency as its README shows it, on its default in-memory adapter or its Redis adapter
// (node-redis). It stores under the raw key, so the load generator puts a per-contender prefix in
// every key and the cleanup deletes that prefix.
async function expressIdempotency(spec, cleanups) {
  if (spec.framework !== 'express') throw new Error('express-idempotency is Express middleware only');
  const { idempotency } = await import('express-idempotency');
  if (spec.store === 'memory') return { express: idempotency() };
  if (spec.store !== 'redis') throw new Error(`express-idempotency has no ${spec.store} adapter`);
  const adapterModule = await import('express-idempotency-redis-adapter');
  const RedisAdapter = adapterModule.default?.default ?? adapterModule.default;
  const dataAdapter = new RedisAdapter({ connectionConfig: { url: redisUrl } });
  await dataAdapter.connect();
  cleanups.push(async () => {
    const client = await ioredisClient();
    await deleteRedisKeys(client, spec.keyPrefix);
    client.disconnect();
    await dataAdapter.disconnect();
  });
  return { express: idempotency({ dataAdapter }) };
}

// @node-idempotency/core with the Express usage of its README: onRequest before the handler (a
// stored response is answered, an in-flight one is an error), onResponse with the handler's answer.
// Its @node-idempotency/express wrapper is not published on npm, so this is that README's glue.
async function nodeIdempotency(spec, cleanups) {
  if (spec.framework !== 'express') throw new Error('@node-idempotency has no published Fastify or Koa wrapper');
  const { Idempotency } = await import('@node-idempotency/core');
  let storage;
  const cacheKeyPrefix = `idem-bench-node-idempotency:${randomUUID()}`;
  if (spec.store === 'memory') {
    const { MemoryStorageAdapter } = await import('@node-idempotency/storage-adapter-memory');
    storage = new MemoryStorageAdapter();
  } else if (spec.store === 'redis') {
    const { RedisStorageAdapter } = await import('@node-idempotency/storage-adapter-redis');
    storage = new RedisStorageAdapter({ url: redisUrl });
    await storage.connect();
    cleanups.push(async () => {
      const client = await ioredisClient();
      await deleteRedisKeys(client, cacheKeyPrefix);
      client.disconnect();
      await storage.disconnect();
    });
  } else {
    throw new Error(`@node-idempotency has no ${spec.store} storage adapter`);
  }
  const idempotency = new Idempotency(storage, { cacheKeyPrefix });
  const statusOf = { REQUEST_IN_PROGRESS: 409, IDEMPOTENCY_FINGERPRINT_MISSMATCH: 422 };
  return {
    express: async (req, res, next) => {
      const request = { method: req.method, headers: req.headers, body: req.body, path: req.path };
      try {
        const stored = await idempotency.onRequest(request);
        if (stored) {
          res.status(stored.additional?.status ?? 200).json(stored.body);
          return;
        }
      } catch (error) {
        res.status(statusOf[error?.code] ?? 400).json({ error: error?.code ?? 'error' });
        return;
      }
      const send = res.json.bind(res);
      res.json = (body) => {
        idempotency.onResponse(request, { body, additional: { status: res.statusCode } }).then(
          () => send(body),
          (error) => next(error),
        );
        return res;
      };
      next();
    },
  };
}
