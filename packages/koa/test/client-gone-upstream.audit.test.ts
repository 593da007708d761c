// Parity audit: a client that leaves while the handler runs. Express and Fastify store what the app
// answers (its error handler's body and status, what a response-shaping layer made of the body): the
// response is still written, to a closed socket, and captured. Koa writes nothing to a gone client,
// so the middleware stores what Koa would have written; but it does so as soon as the chain below it
// returns or throws, before the middleware above it (Koa's documented error-handling middleware, an
// envelope) has run, so the stored answer is not the one the app gives.
import { request as httpRequest } from 'node:http';
import { memoryStore } from '@idem/core';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { idempotency } from '../src/index.js';
import { eventLog, listen } from './support.js';

class ValidationFailed extends Error {}

// POST /orders with a key; the connection is dropped once the handler runs.
function postAndLeave(url: string, key: string, running: Promise<void>) {
  const req = httpRequest(`${url}/orders`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'content-length': '12', 'idempotency-key': key },
  });
  req.on('error', () => undefined);
  req.end('{"amount":1}');
  void running.then(() => req.destroy());
}

const retry = (url: string, key: string) =>
  fetch(`${url}/orders`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: '{"amount":1}',
  });

function appWith(above: Koa.Middleware, handler: (ctx: Koa.Context) => void) {
  const log = eventLog();
  let started!: () => void;
  const running = new Promise<void>((resolve) => {
    started = resolve;
  });
  const app = new Koa();
  app.use(above);
  app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', lease: '1h', onEvent: log.onEvent }));
  app.use(async (ctx) => {
    started();
    if (!ctx.res.destroyed) await new Promise((resolve) => ctx.res.once('close', resolve));
    handler(ctx);
  });
  return { app, log, running };
}

describe('a client gone mid-handler: the outcome stored is the answer the app gives', () => {
  // Was a defect: with Koa's error-handling middleware above idem (try { await next() } catch { ctx.status = 400; ctx.body = {...} }), a client gone mid-handler gets the thrown error stored as a plain "500 Internal Server Error" and replayed so, not the app's 400 JSON answer that Express (error middleware) and Fastify (setErrorHandler) store.
  it("a thrown error is stored as the app's error handler answers it", async () => {
    const { app, log, running } = appWith(
      async (ctx, next) => {
        try {
          await next();
        } catch (error) {
          ctx.status = error instanceof ValidationFailed ? 400 : 500;
          ctx.body = { error: (error as Error).message };
        }
      },
      () => {
        throw new ValidationFailed('amount too low');
      },
    );
    await listen(app, async (url) => {
      postAndLeave(url, 'gone-err', running);
      await log.next(0, 'complete', 'release');
      const replay = await retry(url, 'gone-err');
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect({ status: replay.status, body: await replay.json().catch(() => 'not JSON') }).toEqual({
        status: 400,
        body: { error: 'amount too low' },
      });
    });
  });

  // Was a defect: with a middleware above idem that shapes the response after next() (an envelope { data }), a client gone mid-handler gets the handler's bare body stored and replayed, not the enveloped body the app sends (and Express and Fastify store).
  it('a body is stored as the middleware above shaped it', async () => {
    const { app, log, running } = appWith(
      async (ctx, next) => {
        await next();
        if (ctx.status < 300) ctx.body = { data: ctx.body };
      },
      (ctx) => {
        ctx.status = 201;
        ctx.body = { ok: true };
      },
    );
    await listen(app, async (url) => {
      postAndLeave(url, 'gone-wrap', running);
      await log.next(0, 'complete', 'release');
      const replay = await retry(url, 'gone-wrap');
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect({ status: replay.status, body: await replay.json() }).toEqual({
        status: 201,
        body: { data: { ok: true } },
      });
    });
  });

  it('an error no middleware catches is stored as the plain text Koa answers it with', async () => {
    const { app, log, running } = appWith(
      async (_ctx, next) => {
        await next();
      },
      () => {
        throw Object.assign(new Error('teapot'), { status: 418, expose: true });
      },
    );
    await listen(app, async (url) => {
      postAndLeave(url, 'gone-uncaught', running);
      await log.next(0, 'complete', 'release');
      const replay = await retry(url, 'gone-uncaught');
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      // Was wrong: "I'm a Teapot", the status's text; Koa answers an exposed error with its message.
      expect({ status: replay.status, body: await replay.text() }).toEqual({ status: 418, body: 'teapot' });
    });
  });

  it('a ctx.respond set above idem after the client left is still what Koa reads', async () => {
    const { app, log, running } = appWith(
      async (ctx, next) => {
        await next();
        ctx.set('x-wrapped', 'yes');
        ctx.respond = true;
        expect(ctx.respond).toBe(true);
      },
      (ctx) => {
        ctx.status = 202;
        ctx.body = 'accepted';
      },
    );
    await listen(app, async (url) => {
      postAndLeave(url, 'gone-respond', running);
      await log.next(0, 'complete', 'release');
      const replay = await retry(url, 'gone-respond');
      expect({ status: replay.status, body: await replay.text() }).toEqual({ status: 202, body: 'accepted' });
    });
  });
});
