// One app, three frameworks, for the events audit (*.audit.test.ts / *.audit.int.test.ts): POST
// /orders behind the idempotency middleware, with an outer middleware that runs each request in an
// AsyncLocalStorage context named by its `x-req` header, and a handler steered by `x-mode`:
// - (none): 201 {"ok":true}
// - `gate`: waits until `gate.open()` is called, then 201
// - `until-close`: waits until the client has gone, then answers 201 (to a closed socket)
import { AsyncLocalStorage } from 'node:async_hooks';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent, Store } from '@idem/core';
import { idempotency as expressIdempotency } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';

export const frameworks = ['express', 'fastify', 'koa'] as const;
export type Framework = (typeof frameworks)[number];

/** An event with the `x-req` of the request context it was emitted in (undefined: none). */
export type Seen = IdempotencyEvent & { context: string | undefined };

export interface Harness {
  url: string;
  events: Seen[];
  gate: { open(): void };
  /** Resolves once a handler in mode `until-close` saw its client go. */
  clientGone: Promise<void>;
  /** Resolves on the first event of `type` (from the start). */
  next(type: IdempotencyEvent['type']): Promise<Seen>;
  close(): Promise<void>;
}

export interface HarnessOptions {
  store: Store;
  /** Called after the event was recorded; may throw (the hook the app passes is this one). */
  hook?: (event: IdempotencyEvent) => unknown;
  extra?: Record<string, unknown>;
}

export async function startApp(framework: Framework, options: HarnessOptions): Promise<Harness> {
  // Express and Fastify: the request id, set by the first middleware / onRequest hook. Koa: its own
  // request context (Koa 3's `asyncLocalStorage` option runs the whole request, respond included,
  // in it); a Koa middleware's als.run would not cover Koa's respond(), which runs after the chain.
  const als = new AsyncLocalStorage<unknown>();
  const contextOf = (): string | undefined => {
    const store = als.getStore();
    if (store === undefined || typeof store === 'string') return store;
    return (store as { get(name: string): string }).get('x-req') || undefined;
  };
  const events: Seen[] = [];
  const waiters: Array<{ type: string; resolve: (e: Seen) => void }> = [];
  const onEvent = (event: IdempotencyEvent) => {
    const seen = { ...event, context: contextOf() } as Seen;
    events.push(seen);
    for (const w of waiters.splice(0)) {
      if (w.type === event.type) w.resolve(seen);
      else waiters.push(w);
    }
    return options.hook?.(event);
  };
  let openGate!: () => void;
  const gated = new Promise<void>((resolve) => {
    openGate = resolve;
  });
  let gone!: () => void;
  const clientGone = new Promise<void>((resolve) => {
    gone = resolve;
  });
  const settings = { store: options.store, scope: () => 'tenant-1', onEvent, ...options.extra };
  const work = async (mode: string | undefined, res: import('node:http').ServerResponse) => {
    if (mode === 'gate') await gated;
    if (mode === 'until-close') {
      if (!res.destroyed) await new Promise((resolve) => res.once('close', resolve));
      gone();
    }
  };
  const header = (value: string | string[] | undefined) => (typeof value === 'string' ? value : undefined);

  let url: string;
  let close: () => Promise<void>;
  if (framework === 'express') {
    const app = express();
    app.use((req, _res, next) => als.run(header(req.headers['x-req']), next));
    app.post('/orders', expressIdempotency(settings), express.json(), async (req, res) => {
      await work(header(req.headers['x-mode']), res);
      res.status(201).json({ ok: true });
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    close = async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    };
  } else if (framework === 'fastify') {
    const app = Fastify();
    app.addHook('onRequest', (req, _reply, done) => als.run(header(req.headers['x-req']), done));
    await app.register(fastifyIdempotency, settings);
    app.post('/orders', async (req, reply) => {
      await work(header(req.headers['x-mode']), reply.raw);
      reply.code(201);
      return { ok: true };
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    close = async () => {
      app.server.closeAllConnections();
      await app.close();
    };
  } else {
    const app = new Koa({ asyncLocalStorage: als as AsyncLocalStorage<Koa.Context> });
    app.silent = true;
    app.use(koaIdempotency(settings));
    app.use(async (ctx) => {
      if (ctx.method !== 'POST' || ctx.path !== '/orders') return;
      await work(ctx.get('x-mode') || undefined, ctx.res);
      ctx.status = 201;
      ctx.body = { ok: true };
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    close = async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    };
  }
  return {
    url,
    events,
    gate: { open: openGate },
    clientGone,
    next(type) {
      const seen = events.find((e) => e.type === type);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve) => waiters.push({ type, resolve }));
    },
    close,
  };
}

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** POST /orders with a JSON body, an Idempotency-Key and extra headers, over a fresh connection. */
export function post(url: string, key: string, headers: Record<string, string> = {}, body = '{"amount":1}') {
  return new Promise<Answer>((resolve, reject) => {
    const req = httpRequest(
      `${url}/orders`,
      {
        method: 'POST',
        agent: false,
        headers: {
          'content-type': 'application/json',
          'content-length': String(Buffer.byteLength(body)),
          'idempotency-key': key,
          ...headers,
        },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          text += chunk;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/** POST /orders in mode `until-close`, and drop the connection once the handler runs (`running`). */
export function postAndLeave(url: string, key: string, reqId: string, running: Promise<unknown>) {
  const body = '{"amount":1}';
  const req = httpRequest(`${url}/orders`, {
    method: 'POST',
    agent: false,
    headers: {
      'content-type': 'application/json',
      'content-length': String(Buffer.byteLength(body)),
      'idempotency-key': key,
      'x-req': reqId,
      'x-mode': 'until-close',
    },
  });
  req.on('error', () => {});
  req.end(body);
  void running.then(() => req.destroy());
}
