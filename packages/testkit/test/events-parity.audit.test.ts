// Parity audit of the `onEvent` stream: describeAdapter() compares the HTTP answers of the three
// adapters, not the events they report. Here one app per framework (the middleware app-wide on
// Express and Koa, the plugin on Fastify, a JSON parser after it, POST /orders steered by `x-mode`)
// runs each scenario, and the events, without their timing fields and record id, must be the same
// list on all three: a dashboard or alert built on one framework must read the same on another.
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { bodyParser } from './audit-support/koa-body-parser.js';
import { frameworks, postAndLeave } from './events-harness.js';

type Framework = (typeof frameworks)[number];
type Seen = Record<string, unknown>;

interface Lab {
  url: string;
  events: Seen[];
  runs(): number;
  close(): Promise<void>;
}

// What every framework must report alike: the event without when it happened, how long it took and
// the record's hashed id (the same on all three, but not worth the noise).
function comparable(event: IdempotencyEvent): Seen {
  const { id: _id, at: _at, durationMs: _d, executionMs: _e, error: _error, ...rest } = event as Seen;
  return rest;
}

async function start(framework: Framework, extra: Record<string, unknown> = {}): Promise<Lab> {
  const events: Seen[] = [];
  let runs = 0;
  const options = {
    store: memoryStore(),
    scope: () => 'tenant-1',
    onEvent: (e: IdempotencyEvent) => events.push(comparable(e)),
    ...extra,
  };
  const mode = (value: unknown) => (typeof value === 'string' ? value : undefined);
  // The handler's part, written with the framework's raw response where that is the usual way.
  const act = async (how: string | undefined, raw: import('node:http').ServerResponse) => {
    runs++;
    if (how === 'until-close' && !raw.destroyed) await new Promise((resolve) => raw.once('close', resolve));
    if (how === 'throw') throw new Error('handler failed');
  };
  const sse = (raw: import('node:http').ServerResponse) => {
    raw.writeHead(200, { 'content-type': 'text/event-stream' });
    raw.write('data: 1\n\n');
    raw.end();
  };
  const big = 'x'.repeat(2000);
  if (framework === 'express') {
    const app = express();
    app.use(expressIdempotency(options));
    app.use(express.json());
    app.post('/orders', async (req, res) => {
      const how = mode(req.headers['x-mode']);
      await act(how, res);
      if (how === 'sse') return void sse(res);
      if (how === 'big') return void res.status(201).type('text/plain').send(big);
      if (how === 'release') {
        req.idempotency?.release();
        return void res.status(503).json({ later: true });
      }
      if (how === '204') return void res.status(204).end();
      res.status(201).json({ ok: true });
    });
    app.use(idempotencyErrors());
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    return {
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      events,
      runs: () => runs,
      close: async () => {
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      },
    };
  }
  if (framework === 'fastify') {
    const app = Fastify();
    await app.register(fastifyIdempotency, options);
    app.post('/orders', async (req, reply) => {
      const how = mode(req.headers['x-mode']);
      await act(how, reply.raw);
      if (how === 'sse') {
        reply.hijack();
        sse(reply.raw);
        return reply;
      }
      if (how === 'big') return reply.code(201).type('text/plain').send(big);
      if (how === 'release') {
        req.idempotency?.release();
        return reply.code(503).send({ later: true });
      }
      if (how === '204') return reply.code(204).send();
      return reply.code(201).send({ ok: true });
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    return {
      url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`,
      events,
      runs: () => runs,
      close: async () => {
        app.server.closeAllConnections();
        await app.close();
      },
    };
  }
  const app = new Koa();
  app.silent = true;
  app.use(koaIdempotency(options));
  app.use(bodyParser());
  app.use(async (ctx) => {
    if (ctx.path !== '/orders') return;
    const how = ctx.get('x-mode') || undefined;
    await act(how, ctx.res);
    if (how === 'sse') {
      ctx.respond = false;
      return sse(ctx.res);
    }
    if (how === 'big') {
      ctx.status = 201;
      ctx.type = 'text/plain';
      ctx.body = big;
      return;
    }
    if (how === 'release') ctx.state.idempotency?.release();
    ctx.status = how === 'release' ? 503 : how === '204' ? 204 : 201;
    if (how !== '204') ctx.body = how === 'release' ? { later: true } : { ok: true };
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    events,
    runs: () => runs,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

interface Send {
  key?: string;
  mode?: string;
  body?: string;
  chunked?: boolean;
}

async function send(url: string, { key, mode, body = '{"amount":1}', chunked = false }: Send): Promise<number> {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (key !== undefined) headers['idempotency-key'] = key;
  if (mode !== undefined) headers['x-mode'] = mode;
  const payload = chunked
    ? new ReadableStream({
        start(controller) {
          controller.enqueue(new TextEncoder().encode(body));
          controller.close();
        },
      })
    : body;
  const answer = await fetch(`${url}/orders`, {
    method: 'POST',
    headers,
    body: payload,
    ...(chunked ? { duplex: 'half' } : {}),
  } as RequestInit);
  await answer.arrayBuffer();
  return answer.status;
}

const op = 'POST /orders';

interface Scenario {
  name: string;
  options?: Record<string, unknown>;
  run(lab: Lab): Promise<number[]>;
  statuses: number[];
  events: Seen[];
}

const scenarios: Scenario[] = [
  {
    name: 'fresh run, then replay',
    run: async ({ url }) => [await send(url, { key: 'k' }), await send(url, { key: 'k' })],
    statuses: [201, 201],
    events: [
      { type: 'claim', operation: op },
      { type: 'complete', operation: op, status: 201 },
      { type: 'replay', operation: op, status: 201 },
    ],
  },
  {
    name: 'same key, other body: 422',
    run: async ({ url }) => [await send(url, { key: 'k' }), await send(url, { key: 'k', body: '{"amount":2}' })],
    statuses: [201, 422],
    events: [
      { type: 'claim', operation: op },
      { type: 'complete', operation: op, status: 201 },
      { type: 'mismatch', operation: op },
    ],
  },
  {
    name: 'body over maxBodyBytes, with a length',
    options: { maxBodyBytes: 5 },
    run: async ({ url }) => [await send(url, { key: 'k' })],
    statuses: [413],
    events: [{ type: 'refused', code: 'body_too_large', status: 413, operation: op }],
  },
  {
    name: 'body over maxBodyBytes, chunked',
    options: { maxBodyBytes: 5 },
    run: async ({ url }) => [await send(url, { key: 'k', chunked: true })],
    statuses: [413],
    events: [{ type: 'refused', code: 'body_too_large', status: 413, operation: op }],
  },
  {
    name: "handler throws under storeOutcome 'stripe'",
    options: { storeOutcome: 'stripe' },
    run: async ({ url }) => [await send(url, { key: 'k', mode: 'throw' }), await send(url, { key: 'k' })],
    statuses: [500, 201],
    events: [
      { type: 'claim', operation: op },
      { type: 'release', operation: op },
      { type: 'not-stored', operation: op, status: 500 },
      { type: 'claim', operation: op },
      { type: 'complete', operation: op, status: 201 },
    ],
  },
  {
    name: 'response over maxResponseBytes',
    options: { maxResponseBytes: 1000 },
    run: async ({ url }) => [await send(url, { key: 'k', mode: 'big' }), await send(url, { key: 'k', mode: 'big' })],
    statuses: [201, 500],
    events: [
      { type: 'claim', operation: op },
      { type: 'response-not-stored', operation: op, reason: 'too-large', status: 201 },
      { type: 'complete', operation: op, status: 500 },
      { type: 'replay', operation: op, status: 500 },
    ],
  },
  {
    name: 'server-sent events',
    run: async ({ url }) => [await send(url, { key: 'k', mode: 'sse' })],
    statuses: [200],
    events: [
      { type: 'claim', operation: op },
      { type: 'response-not-stored', operation: op, reason: 'event-stream', status: 200 },
      { type: 'release', operation: op },
    ],
  },
  {
    name: 'release() then 503',
    run: async ({ url }) => [await send(url, { key: 'k', mode: 'release' })],
    statuses: [503],
    events: [
      { type: 'claim', operation: op },
      { type: 'release', operation: op },
      { type: 'not-stored', operation: op, status: 503 },
    ],
  },
  {
    name: '204, then replay',
    run: async ({ url }) => [await send(url, { key: 'k', mode: '204' }), await send(url, { key: 'k', mode: '204' })],
    statuses: [204, 204],
    events: [
      { type: 'claim', operation: op },
      { type: 'complete', operation: op, status: 204 },
      { type: 'replay', operation: op, status: 204 },
    ],
  },
  {
    name: 'key missing where required',
    run: async ({ url }) => [await send(url, {})],
    statuses: [400],
    events: [{ type: 'refused', code: 'key_missing', status: 400, operation: op }],
  },
  {
    name: 'key malformed',
    run: async ({ url }) => [await send(url, { key: 'a,b' })],
    statuses: [400],
    events: [{ type: 'refused', code: 'key_invalid', status: 400, operation: op }],
  },
  {
    name: 'no caller to scope the key to',
    options: { scope: () => undefined },
    run: async ({ url }) => [await send(url, { key: 'k' })],
    statuses: [500],
    events: [{ type: 'refused', code: 'scope_missing', status: 500, operation: op }],
  },
  {
    name: 'mintKeys, no key sent',
    options: { mintKeys: true },
    run: async ({ url }) => [await send(url, {})],
    statuses: [201],
    events: [
      { type: 'claim', operation: op },
      { type: 'complete', operation: op, status: 201 },
    ],
  },
  {
    name: 'client gone mid-handler, then retry',
    run: async (lab) => {
      postAndLeave(
        lab.url,
        'k',
        'gone',
        new Promise<void>((resolve) => {
          const check = setInterval(() => {
            if (lab.runs() > 0) {
              clearInterval(check);
              resolve();
            }
          }, 2);
        }),
      );
      while (!lab.events.some((e) => e.type === 'complete')) await new Promise((resolve) => setTimeout(resolve, 5));
      return [await send(lab.url, { key: 'k' })];
    },
    statuses: [201],
    events: [
      { type: 'claim', operation: op },
      { type: 'complete', operation: op, status: 201 },
      { type: 'replay', operation: op, status: 201 },
    ],
  },
];

describe.each(scenarios)('$name: the same events on Express, Fastify and Koa', (scenario) => {
  it.each(frameworks)('%s', async (framework) => {
    const lab = await start(framework, scenario.options);
    try {
      const statuses = await scenario.run(lab);
      // Settlement events may follow the last byte by a tick (the store answers at once here).
      await new Promise((resolve) => setImmediate(resolve));
      expect({ statuses, events: lab.events }).toEqual({ statuses: scenario.statuses, events: scenario.events });
    } finally {
      await lab.close();
    }
  });
});
