// `IdempotencyContext.answeringForHandler()`: a timeout of the app's own that says so before it
// answers for a handler still running. Express (a plain `setTimeout` in the route), Fastify (a timer
// that sends the reply) and Koa (a timeout middleware mounted after `idempotency()`, which throws its
// 503 through it) left no signal the adapters could read: the 503 was settled as the key's outcome
// while the handler went on to make its effect (stored and replayed under the default policy; under
// 'stripe', released, and the retry ran the handler a second time). Said, the answer goes out, the key
// is kept with `500 response_not_replayable` under either policy, and the handler runs once; in
// transactional mode (PostgreSQL) the transaction rolls back and the key is released. Real sockets,
// the memory store and PostgreSQL.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { type IdempotencyOptions, memoryStore, type Store } from '@idem/core';
import { idempotency as expressIdempotency } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import type { PostgresTransaction } from '@idem/postgres';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { gate, listen, post, retryPast409, until } from '../../core/test/support/timeouts-kit.js';
import { postgresStoreTable } from './audit-support/postgres-store-table.js';

const { available: withPostgres, store: postgres } = await postgresStoreTable(
  'answering_for_handler',
  'the answeringForHandler transactional cases',
);

type Framework = 'express' | 'fastify' | 'koa';
const frameworks: Framework[] = ['express', 'fastify', 'koa'];
const auth = { sub: 'user-1', iss: 'https://issuer.test' };

interface Server {
  url: string;
  effects: { started: number; finished: number; refused: number };
  provider: ReturnType<typeof gate>;
  close: () => Promise<void>;
}

interface Setup {
  store: Store;
  storeOutcome?: IdempotencyOptions['storeOutcome'];
  transactional?: boolean;
  /** When the timer fires, in ms; it says `answeringForHandler()` unless `silent`. */
  answerAfter: number;
  silent?: boolean;
  /** The handler calls `answeringForHandler()` itself right after its answer: a timer firing late. */
  late?: boolean;
}

// The handler: one effect started, then (transactional) a first write, a wait on `provider`, and a
// second write before its 201. Its timer, in each framework's own way, answers 503 for it.
async function effect(setup: Setup, tx: unknown, effects: Server['effects'], provider: Server['provider']) {
  effects.started++;
  try {
    if (setup.transactional) await (tx as PostgresTransaction).query('select 1');
    await provider.promise;
    if (setup.transactional) await (tx as PostgresTransaction).query('select 2');
    effects.finished++;
  } catch {
    // The rolled-back transaction refuses the handler's later writes.
    effects.refused++;
  }
}

async function start(framework: Framework, setup: Setup): Promise<Server> {
  const effects = { started: 0, finished: 0, refused: 0 };
  const provider = gate();
  const options = {
    store: setup.store,
    storeTimeout: '15s' as const,
    storeOutcome: setup.storeOutcome,
    transactional: setup.transactional,
  };
  if (framework === 'express') {
    const app = express();
    app.use((req, _res, next) => {
      (req as { auth?: unknown }).auth = auth;
      next();
    });
    app.use(expressIdempotency(options));
    app.post('/charges', async (req, res) => {
      const timer = setTimeout(() => {
        if (!setup.silent) req.idempotency?.answeringForHandler();
        res.status(503).json({ error: 'timeout' });
      }, setup.answerAfter);
      await effect(setup, req.idempotency?.tx, effects, provider);
      clearTimeout(timer);
      if (!res.headersSent) res.status(201).json({ id: `ch_${effects.started}` });
      if (setup.late) req.idempotency?.answeringForHandler();
    });
    const listening = await listen(http.createServer(app));
    return { url: `${listening.url}/charges`, effects, provider, close: listening.close };
  }
  if (framework === 'fastify') {
    const app = Fastify();
    app.addHook('onRequest', async (request) => {
      (request as { auth?: unknown }).auth = auth;
    });
    await app.register(fastifyIdempotency, options);
    app.post('/charges', async (request, reply) => {
      const timer = setTimeout(() => {
        if (!setup.silent) request.idempotency?.answeringForHandler();
        void reply.code(503).send({ error: 'timeout' });
      }, setup.answerAfter);
      await effect(setup, request.idempotency?.tx, effects, provider);
      clearTimeout(timer);
      if (reply.sent) return reply;
      await reply.code(201).send({ id: `ch_${effects.started}` });
      if (setup.late) request.idempotency?.answeringForHandler();
      return reply;
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = app.server.address() as AddressInfo;
    return { url: `http://127.0.0.1:${port}/charges`, effects, provider, close: () => app.close() };
  }
  const app = new Koa();
  app.silent = true;
  app.use(async (ctx, next) => {
    ctx.state.auth = auth as never;
    await next();
  });
  app.use(koaIdempotency(options));
  // A timeout mounted after idempotency(): its 503 is thrown through idempotency()'s `await next()`.
  app.use(async (ctx, next) => {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => {
        if (!setup.silent) ctx.state.idempotency?.answeringForHandler();
        reject(Object.assign(new Error('timeout'), { status: 503, expose: true }));
      }, setup.answerAfter);
    });
    try {
      await Promise.race([next(), timedOut]);
    } finally {
      clearTimeout(timer);
    }
  });
  app.use(async (ctx) => {
    await effect(setup, ctx.state.idempotency?.tx, effects, provider);
    ctx.status = 201;
    ctx.body = { id: `ch_${effects.started}` };
    // Koa writes after the chain returned: a timer firing once the response ended.
    if (setup.late) {
      const { answeringForHandler } = ctx.state.idempotency ?? {};
      ctx.res.once('finish', () => answeringForHandler?.());
    }
  });
  const listening = await listen(http.createServer(app.callback()));
  return { url: `${listening.url}/charges`, effects, provider, close: listening.close };
}

const problemCode = (body: string) => (JSON.parse(body) as { code?: string }).code;

describe.each(frameworks)('%s: a timeout that says answeringForHandler()', (framework) => {
  it.each([undefined, 'stripe'] as const)(
    'policy %s: its 503 goes out, the key is kept as 500 response_not_replayable, the handler runs once',
    async (storeOutcome) => {
      const server = await start(framework, { store: memoryStore(), storeOutcome, answerAfter: 100 });
      try {
        const first = await post(server.url, 'k1');
        expect(first.status).toBe(503);
        // The timeout's own answer (Koa's error handler writes an exposed error's message as text).
        expect(first.body).toBe(framework === 'koa' ? 'timeout' : '{"error":"timeout"}');
        // Kept at once: a retry while the handler still runs learns that the operation ran.
        const during = await post(server.url, 'k1');
        expect(during.status).toBe(500);
        expect(problemCode(during.body)).toBe('response_not_replayable');
        server.provider.open();
        await until(() => server.effects.finished === 1);
        const after = await retryPast409(server.url, 'k1');
        expect(after.status).toBe(500);
        expect(problemCode(after.body)).toBe('response_not_replayable');
        expect(server.effects.started).toBe(1);
      } finally {
        server.provider.open();
        await server.close();
      }
    },
  );

  it('called after the handler answered (its timer firing late): the 201 stays the outcome, replayed', async () => {
    const server = await start(framework, { store: memoryStore(), answerAfter: 10_000, late: true });
    try {
      server.provider.open();
      const first = await post(server.url, 'k2');
      expect(first.status).toBe(201);
      // Too late, it changes nothing: the outcome stored is the handler's.
      const replay = await post(server.url, 'k2');
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(server.effects.started).toBe(1);
    } finally {
      await server.close();
    }
  });

  it.runIf(withPostgres)(
    'transactional: rolled back and released (503 store_unavailable); the retry runs it once, whole',
    async () => {
      const server = await start(framework, { store: postgres(), transactional: true, answerAfter: 150 });
      try {
        const first = await post(server.url, `${framework}-k3`);
        expect(first.status).toBe(503);
        expect(problemCode(first.body)).toBe('store_unavailable');
        server.provider.open();
        // The first handler goes on, and its transaction refuses its next write.
        await until(() => server.effects.refused === 1);
        const retry = await retryPast409(server.url, `${framework}-k3`);
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBeUndefined();
        expect(server.effects.finished).toBe(1);
        expect(server.effects.started).toBe(2);
      } finally {
        server.provider.open();
        await server.close();
      }
    },
  );
});
