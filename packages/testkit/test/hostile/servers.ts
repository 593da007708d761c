// The real servers hostile input is thrown at: the same three routes built with each adapter.
//   POST /charges  idempotency() (memory store, 64 KiB body limit), then the framework's JSON parsing
//   POST /secure   the JWT guard (HS256 issuer), then a handler that answers 201 with the caller
//   POST /hooks    the Standard Webhooks receiver (memory store)
// Each counts its handler runs and any 5xx it sends, so a test can tell "refused" from "ran".
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import { guard as expressGuard, idempotency as expressIdempotency } from '@idem/express';
import { guard as fastifyGuard, idempotency as fastifyIdempotency } from '@idem/fastify';
import type { GuardOptions } from '@idem/guard';
import { guard as koaGuard, idempotency as koaIdempotency } from '@idem/koa';
import { createReceiver, expressWebhook, fastifyWebhook, type KoaLikeContext, koaWebhook } from '@idem/webhooks';
import express, { type NextFunction, type Request, type Response } from 'express';
import Fastify from 'fastify';
import Koa from 'koa';

export const ISSUER = 'https://id.hostile.test';
export const AUDIENCE = 'https://api.hostile.test';
export const JWT_SECRET = 'a-hostile-input-test-secret-of-32-bytes-or-more!';
export const WEBHOOK_SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
export const maxBodyBytes = 64 * 1024;

export const guardOptions: GuardOptions = {
  audience: AUDIENCE,
  issuers: [{ issuer: ISSUER, secret: JWT_SECRET }],
};

export type AdapterName = 'express' | 'fastify' | 'koa';
export const adapterNames: readonly AdapterName[] = ['express', 'fastify', 'koa'];

export interface HostileServer {
  readonly name: AdapterName;
  readonly port: number;
  /** Handler runs per route. */
  readonly runs: Record<'charges' | 'secure' | 'hooks', number>;
  close(): Promise<void>;
}

const idempotencyOptions = () => ({
  store: memoryStore(),
  scope: () => 'hostile',
  maxBodyBytes,
});

const receiverFor = (runs: HostileServer['runs']) =>
  createReceiver({
    store: memoryStore(),
    secret: WEBHOOK_SECRET,
    apply: () => {
      runs.hooks++;
    },
  });

export async function startServer(name: AdapterName): Promise<HostileServer> {
  const runs = { charges: 0, secure: 0, hooks: 0 };
  if (name === 'express') {
    const app = express();
    app.post(
      '/charges',
      expressIdempotency(idempotencyOptions()),
      express.json({ limit: maxBodyBytes }),
      (_req, res) => {
        runs.charges++;
        res.status(201).json({ ok: true });
      },
    );
    app.post('/secure', expressGuard(guardOptions), (req, res) => {
      runs.secure++;
      res.status(201).json({ sub: req.auth?.sub });
    });
    app.post('/hooks', expressWebhook(receiverFor(runs)));
    // Express's own errors (a body parser's 400 or 413) keep their status; only a real fault is 500.
    app.use((error: { status?: number }, _req: Request, res: Response, _next: NextFunction) => {
      res.status(error.status ?? 500).json({ error: 'refused' });
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    return {
      name,
      port: (server.address() as AddressInfo).port,
      runs,
      close: () => new Promise((resolve) => server.close(() => resolve())),
    };
  }
  if (name === 'fastify') {
    const app = Fastify({ bodyLimit: maxBodyBytes });
    await app.register(async (scope) => {
      await scope.register(fastifyIdempotency, idempotencyOptions());
      scope.post('/charges', async (_request, reply) => {
        runs.charges++;
        return reply.code(201).send({ ok: true });
      });
    });
    app.post('/secure', { onRequest: fastifyGuard(guardOptions) }, async (request, reply) => {
      runs.secure++;
      return reply.code(201).send({ sub: request.auth?.sub });
    });
    await app.register(fastifyWebhook(receiverFor(runs), { path: '/hooks' }));
    await app.listen({ port: 0, host: '127.0.0.1' });
    return { name, port: (app.server.address() as AddressInfo).port, runs, close: () => app.close() };
  }
  const app = new Koa();
  app.silent = true;
  const charges = koaIdempotency(idempotencyOptions());
  const secure = koaGuard(guardOptions);
  const hooks = koaWebhook(receiverFor(runs), { path: '/hooks' });
  app.use(async (ctx, next) => {
    // Koa's own Request type has no `body` (a body parser adds it); the glue only reads it.
    if (ctx.path === '/hooks') return hooks(ctx as unknown as KoaLikeContext, next);
    if (ctx.path === '/secure' && ctx.method === 'POST')
      return secure(ctx, async () => {
        runs.secure++;
        ctx.status = 201;
        ctx.body = { sub: ctx.state.auth?.sub };
      });
    if (ctx.path === '/charges' && ctx.method === 'POST')
      return charges(ctx, async () => {
        // The JSON parsing a body parser would do after the middleware: bad JSON is the client's 400.
        const chunks: Buffer[] = [];
        for await (const chunk of ctx.req) chunks.push(chunk as Buffer);
        const text = Buffer.concat(chunks).toString('utf8');
        if (ctx.is('application/json') && text.length > 0) {
          try {
            JSON.parse(text);
          } catch {
            ctx.status = 400;
            ctx.body = { error: 'invalid JSON' };
            return;
          }
        }
        runs.charges++;
        ctx.status = 201;
        ctx.body = { ok: true };
      });
    return next();
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return {
    name,
    port: (server.address() as AddressInfo).port,
    runs,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** Starts one server per adapter. */
export async function startAll(): Promise<HostileServer[]> {
  return Promise.all(adapterNames.map((name) => startServer(name)));
}
