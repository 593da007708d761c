// Audit: the glue's `limit` and a body a parser on the route already read into a Buffer. Fastify's
// handler holds such a body to `limit` (decodeBody); Express's and Koa's take it whatever its size
// (requireBuffer only), so `expressWebhook(receiver, { limit: 1024 })` behind
// `express.raw({ limit: '5mb' })` applies a 1 MiB body. The docs say the glue's limit holds "when the
// glue reads the body", and that express.raw()'s own limit rules otherwise; DESIGN asks for one
// outcome in every framework.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import express from 'express';
import { afterEach, describe, expect, it } from 'vitest';
import { createReceiver, createSigner, expressWebhook, fastifyWebhookHandler } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from(JSON.stringify({ pad: 'x'.repeat(4096) }));
const headers = () => signer.sign({ id: 'evt_big', body, timestamp: new Date() });

const receiver = (applied: string[]) =>
  createReceiver({ store: memoryStore(), secret: SECRET, apply: (event) => void applied.push(event.id) });

const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) await new Promise((resolve) => server.close(resolve));
});

describe('a body a parser read into a Buffer, over the glue limit', () => {
  it('fastifyWebhookHandler refuses it with 413 (the control)', async () => {
    const applied: string[] = [];
    const handler = fastifyWebhookHandler(receiver(applied), { limit: 1024 });
    let status = 0;
    const reply = {
      code: (code: number) => {
        status = code;
        return reply;
      },
      header: () => reply,
      send: () => reply,
    };
    await handler({ body, headers: { ...headers(), 'content-length': String(body.length) } } as never, reply as never);
    expect(status).toBe(413);
    expect(applied).toEqual([]);
  });

  // Was wrong: expressWebhook (and koaWebhook) ignore an explicit glue `limit` for a body a route parser
  // (express.raw()) already read, where fastifyWebhookHandler enforces it; needs a decision: hold such
  // a Buffer to the glue's limit always (a 1-5 MiB body express.raw({ limit: '5mb' }) took would newly
  // be 413 under the default 1 MiB), or only to a limit given explicitly, or document the difference.
  it.fails('expressWebhook behind express.raw() refuses it with 413 as well', async () => {
    const applied: string[] = [];
    const app = express();
    app.post('/hooks', express.raw({ type: '*/*', limit: '5mb' }), expressWebhook(receiver(applied), { limit: 1024 }));
    const server = createServer(app);
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
    const response = await fetch(url, {
      method: 'POST',
      headers: { ...headers(), 'content-type': 'application/json' },
      body,
    });
    await response.arrayBuffer();
    expect(response.status).toBe(413);
    expect(applied).toEqual([]);
  });
});
