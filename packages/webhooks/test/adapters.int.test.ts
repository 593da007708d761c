import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import { memoryStore } from '@idem/core';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  createReceiver,
  createSigner,
  expressWebhook,
  fastifyWebhook,
  fastifyWebhookHandler,
  koaWebhook,
  type WebhookError,
} from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"amount":4200,"note":"Zoë 😀"}}');

const servers: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (servers.length) await servers.pop()!();
});

function makeReceiver() {
  const applied: string[] = [];
  const receiver = createReceiver({
    store: memoryStore(),
    secret: SECRET,
    apply: (event) => void applied.push(event.id),
  });
  return { receiver, applied };
}

async function listen(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  servers.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function post(
  url: string,
  id: string,
  payload: Buffer = body,
  extra: Record<string, string> = {},
  wire: Buffer = payload,
) {
  const headers = signer.sign({ id, body: payload, timestamp: new Date() });
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers, ...extra },
    body: new Uint8Array(wire),
  });
}

type Start = (
  receiver: ReturnType<typeof makeReceiver>['receiver'],
  onMisconfigured?: (e: WebhookError) => void,
) => Promise<string>;

// The glue's options with the hook, or without any (to see the default warning).
const hooked = (onMisconfigured?: (e: WebhookError) => void) => (onMisconfigured ? { onMisconfigured } : {});

const frameworks: Record<string, { good: Start; parsedFirst: Start }> = {
  express: {
    async good(receiver) {
      const app = express();
      app.post('/hooks', expressWebhook(receiver, { limit: 4096 }));
      app.use(express.json());
      return listen(createServer(app));
    },
    async parsedFirst(receiver, onMisconfigured) {
      const app = express();
      app.use(express.json());
      app.post('/hooks', expressWebhook(receiver, hooked(onMisconfigured)));
      return listen(createServer(app));
    },
  },
  fastify: {
    async good(receiver) {
      const app = Fastify();
      app.register(fastifyWebhook(receiver, { path: '/hooks', limit: 4096 }));
      app.post('/other', async (request) => ({ parsed: typeof request.body }));
      await app.listen({ port: 0, host: '127.0.0.1' });
      servers.push(() => app.close());
      return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    },
    async parsedFirst(receiver, onMisconfigured) {
      const app = Fastify();
      app.post('/hooks', fastifyWebhookHandler(receiver, hooked(onMisconfigured)));
      await app.listen({ port: 0, host: '127.0.0.1' });
      servers.push(() => app.close());
      return `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    },
  },
  koa: {
    async good(receiver) {
      const app = new Koa();
      app.use(koaWebhook(receiver, { path: '/hooks', limit: 4096 }));
      app.use((ctx) => {
        ctx.status = 404;
      });
      return listen(createServer(app.callback()));
    },
    async parsedFirst(receiver, onMisconfigured) {
      const app = new Koa();
      // What a body parser does: read the stream and leave a parsed object behind.
      app.use(async (ctx, next) => {
        const chunks: Buffer[] = [];
        for await (const chunk of ctx.req) chunks.push(chunk as Buffer);
        (ctx.request as unknown as { body: unknown }).body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        await next();
      });
      app.use(koaWebhook(receiver, hooked(onMisconfigured)));
      return listen(createServer(app.callback()));
    },
  },
};

describe.each(Object.keys(frameworks))('%s glue (cases 21, 22, 23)', (name) => {
  const framework = frameworks[name]!;

  it('verifies the raw bytes, applies once and acknowledges the duplicate', async () => {
    const { receiver, applied } = makeReceiver();
    const url = `${await framework.good(receiver, () => undefined)}/hooks`;
    const first = await post(url, 'E1');
    expect(first.status).toBe(200);
    expect(await first.json()).toEqual({ received: true });
    const again = await post(url, 'E1');
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(applied).toEqual(['E1']);
  });

  it('decodes a gzip body before verifying, and refuses an unknown encoding with 415', async () => {
    const { receiver, applied } = makeReceiver();
    const url = `${await framework.good(receiver, () => undefined)}/hooks`;
    const zipped = await post(url, 'E2', body, { 'content-encoding': 'gzip' }, gzipSync(body));
    expect(zipped.status).toBe(200);
    const odd = await post(url, 'E3', body, { 'content-encoding': 'zstd-ish' });
    expect(odd.status).toBe(415);
    expect((await odd.json()).code).toBe('body_encoding_unsupported');
    expect(applied).toEqual(['E2']);
  });

  it('answers 413 over the limit, compressed or not', async () => {
    const { receiver, applied } = makeReceiver();
    const url = `${await framework.good(receiver, () => undefined)}/hooks`;
    const big = Buffer.from(JSON.stringify({ pad: 'x'.repeat(10_000) }));
    expect((await post(url, 'E4', big)).status).toBe(413);
    const bomb = await post(url, 'E5', big, { 'content-encoding': 'gzip' }, gzipSync(big));
    expect(bomb.status).toBe(413);
    expect(applied).toEqual([]);
  });

  it("answers 413 with the receiver's problem body, whether the length is declared or the body is chunked", async () => {
    // Was a defect: Fastify's own parser refused the body first and answered its own JSON error.
    const { receiver, applied } = makeReceiver();
    const url = `${await framework.good(receiver, () => undefined)}/hooks`;
    const big = Buffer.from(JSON.stringify({ pad: 'x'.repeat(10_000) }));
    const chunked = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new Uint8Array(big));
        controller.close();
      },
    });
    const declared = await post(url, 'E4', big);
    const streamed = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...signer.sign({ id: 'E5', body: big, timestamp: new Date() }) },
      body: chunked,
      duplex: 'half',
    } as RequestInit);
    for (const response of [declared, streamed]) {
      expect(response.status).toBe(413);
      expect(response.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(await response.json()).toMatchObject({
        status: 413,
        code: 'body_too_large',
        type: 'https://idem.dev/problems/body-too-large',
      });
    }
    expect(applied).toEqual([]);
  });

  it('refuses a tampered body with 400 and records nothing', async () => {
    const { receiver, applied } = makeReceiver();
    const url = `${await framework.good(receiver, () => undefined)}/hooks`;
    const tampered = Buffer.from(body);
    tampered[5] = (tampered[5] as number) ^ 1;
    const response = await post(url, 'E6', body, {}, tampered);
    expect(response.status).toBe(400);
    expect((await response.json()).code).toBe('signature_mismatch');
    expect((await post(url, 'E6')).status).toBe(200);
    expect(applied).toEqual(['E6']);
  });

  it('fails closed with raw_body_required when a parser ran first, not with a signature mismatch', async () => {
    const { receiver, applied } = makeReceiver();
    const seen: WebhookError[] = [];
    const url = `${await framework.parsedFirst(receiver, (error) => seen.push(error))}/hooks`;
    const response = await post(url, 'E7');
    expect(response.status).toBe(500);
    expect(response.headers.get('content-type')).toMatch(/problem\+json/);
    expect(await response.json()).toMatchObject({
      code: 'raw_body_required',
      type: 'https://idem.dev/problems/raw-body-required',
    });
    expect(seen.map((e) => e.code)).toEqual(['raw_body_required']);
    expect(applied).toEqual([]);
  });

  it('warns once per route by default, not once per delivery attempt', async () => {
    // Was a defect: every refused delivery wrote the same warning, so a sender's retries flooded the logs.
    const warnings = vi.spyOn(process, 'emitWarning').mockImplementation(() => undefined);
    try {
      const { receiver, applied } = makeReceiver();
      const url = `${await framework.parsedFirst(receiver)}/hooks`;
      for (const id of ['E9', 'E9', 'E10']) {
        const response = await post(url, id);
        expect(response.status).toBe(500);
        expect((await response.json()).code).toBe('raw_body_required');
      }
      expect(warnings.mock.calls.map((call) => (call[1] as { code?: string }).code)).toEqual(['IDEM_WEBHOOK_RAW_BODY']);
      // Another route (its own options) still gets its one warning.
      const other = `${await framework.parsedFirst(receiver)}/hooks`;
      expect((await post(other, 'E11')).status).toBe(500);
      expect(warnings).toHaveBeenCalledTimes(2);
      expect(applied).toEqual([]);
    } finally {
      warnings.mockRestore();
    }
  });

  it('answers the same 500 when onMisconfigured throws or rejects', async () => {
    const hooks = [
      () => {
        throw new Error('hook bug');
      },
      // Unhandled, the rejection would fail this file (and end a real server).
      () => Promise.reject(new Error('hook bug')),
    ];
    for (const onMisconfigured of hooks) {
      const { receiver, applied } = makeReceiver();
      const url = `${await framework.parsedFirst(receiver, onMisconfigured)}/hooks`;
      const response = await post(url, 'E8');
      expect(response.status).toBe(500);
      expect((await response.json()).code).toBe('raw_body_required');
      expect(applied).toEqual([]);
    }
  });
});

describe('framework specifics', () => {
  it('express: takes the Buffer of express.raw() and refuses the string of express.text()', async () => {
    const { receiver, applied } = makeReceiver();
    const app = express();
    app.post('/raw', express.raw({ type: '*/*' }), expressWebhook(receiver));
    app.post('/text', express.text({ type: '*/*' }), expressWebhook(receiver, { onMisconfigured: () => undefined }));
    const base = await listen(createServer(app));
    expect((await post(`${base}/raw`, 'E1')).status).toBe(200);
    const text = await post(`${base}/text`, 'E2');
    expect(text.status).toBe(500);
    expect((await text.json()).code).toBe('raw_body_required');
    expect(applied).toEqual(['E1']);
  });

  it('express 4: reads the stream under the {} an app-wide parser left on a request it skipped, unread', async () => {
    // Express 4's body-parser sets req.body = {} on every request, even one of a type it does not
    // parse and whose stream it never touched; Express 5's leaves it undefined.
    const express4 = (await import('express4' as string)).default as typeof express;
    const { receiver, applied } = makeReceiver();
    const seen: WebhookError[] = [];
    const app = express4();
    app.use(express4.urlencoded({ extended: false })); // a form parser for the rest of the app
    app.post('/hooks', expressWebhook(receiver, { onMisconfigured: (error) => seen.push(error) }) as never);
    app.use(express4.json());
    app.post('/parsed', expressWebhook(receiver, { onMisconfigured: (error) => seen.push(error) }) as never);
    const base = await listen(createServer(app));
    expect((await post(`${base}/hooks`, 'E1')).status).toBe(200);
    expect((await post(`${base}/hooks`, 'E1')).headers.get('idempotent-replayed')).toBe('true');
    expect(applied).toEqual(['E1']);
    // A parser that did read the body still fails closed, even when what it parsed is an empty {}.
    for (const payload of [body, Buffer.from('{}')]) {
      const parsed = await post(`${base}/parsed`, 'E2', payload);
      expect(parsed.status).toBe(500);
      expect((await parsed.json()).code).toBe('raw_body_required');
    }
    expect(seen.map((e) => e.code)).toEqual(['raw_body_required', 'raw_body_required']);
    expect(applied).toEqual(['E1']);
  });

  it('express 5: a body its parsers read to `{}` (JSON `{}`, a form of no fields) fails closed, at once', async () => {
    // body-parser 2 sets no `req._body`, and the form parser's `{}` has no prototype: only the read
    // stream tells such a `{}` from a placeholder. Read again, it would wait for bytes already taken.
    const { receiver, applied } = makeReceiver();
    const seen: WebhookError[] = [];
    const app = express();
    app.use(express.json(), express.urlencoded({ extended: false }));
    app.post('/hooks', expressWebhook(receiver, { onMisconfigured: (error) => seen.push(error) }) as never);
    const base = await listen(createServer(app));
    const form = { 'content-type': 'application/x-www-form-urlencoded' };
    for (const [payload, extra] of [
      [Buffer.from('{}'), {}],
      [Buffer.from('&'), form],
      [Buffer.from('='), form],
    ] as const) {
      const response = await post(`${base}/hooks`, 'E3', payload, extra);
      expect(response.status, payload.toString()).toBe(500);
      expect((await response.json()).code).toBe('raw_body_required');
    }
    expect(seen).toHaveLength(3);
    expect(applied).toEqual([]);
  }, 10_000);

  it('koa: reads the stream under the {} a parser left on a request it skipped, unread', async () => {
    const { receiver, applied } = makeReceiver();
    const app = new Koa();
    // What koa-bodyparser does with a content type it does not parse.
    app.use(async (ctx, next) => {
      (ctx.request as unknown as { body: unknown }).body = {};
      await next();
    });
    app.use(koaWebhook(receiver, { path: '/hooks' }));
    const base = await listen(createServer(app.callback()));
    expect((await post(`${base}/hooks`, 'E1')).status).toBe(200);
    expect(applied).toEqual(['E1']);
  });

  it('fastify: the buffer parser stays inside the plugin; other routes keep parsing JSON', async () => {
    const { receiver } = makeReceiver();
    const base = await frameworks.fastify!.good(receiver, () => undefined);
    const other = await fetch(`${base}/other`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"a":1}',
    });
    expect(await other.json()).toEqual({ parsed: 'object' });
  });

  it('koa: passes requests for other paths and methods to the next middleware', async () => {
    const { receiver } = makeReceiver();
    const base = await frameworks.koa!.good(receiver, () => undefined);
    expect((await fetch(`${base}/elsewhere`, { method: 'POST', body: 'x' })).status).toBe(404);
    expect((await fetch(`${base}/hooks`)).status).toBe(404);
  });
});
