// Case 23 and koajs/bodyparser#43, #73 with the real parsers: `ctx.request.rawBody` is missing when
// the content type is not one the parser reads, or the body is gzip-encoded, and the parsed object
// cannot be verified. Mounted before koaWebhook by mistake, a parser that read the body must make
// the glue fail closed with raw_body_required (never a signature mismatch, never a 2xx); one that
// skipped the body leaves the stream to the glue, which verifies its bytes.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { gzipSync } from 'node:zlib';
import { memoryStore } from '@idem/core';
import Koa from 'koa';
import { afterEach, describe, expect, it } from 'vitest';
import { createReceiver, createSigner, koaWebhook, type WebhookError } from '../src/index.js';

// Loaded by specifiers TypeScript does not follow (see packages/koa/test/bodyparser.test.ts: their
// declarations add `body` to every IncomingMessage, which would retype Express's `req.body`).
const modules: string[] = ['@koa/bodyparser', 'koa-body'];
const [{ bodyParser }, { koaBody }] = (await Promise.all(modules.map((name) => import(name)))) as [
  { bodyParser: () => Koa.Middleware },
  { koaBody: () => Koa.Middleware },
];

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"amount":4200,"note":"Zoë 😀"}}');

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (closers.length) await closers.pop()?.();
});

async function start(parser: Koa.Middleware, order: 'parser-first' | 'webhook-first') {
  const applied: string[] = [];
  const misconfigured: WebhookError[] = [];
  const receiver = createReceiver({
    store: memoryStore(),
    secret: SECRET,
    apply: (event) => void applied.push(event.id),
  });
  const webhook = koaWebhook(receiver, { path: '/hooks', onMisconfigured: (error) => misconfigured.push(error) });
  const app = new Koa();
  if (order === 'parser-first') app.use(parser).use(webhook);
  else app.use(webhook).use(parser);
  const server = createServer(app.callback());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
  const post = (id: string, contentType: string, encoding?: 'gzip') =>
    fetch(url, {
      method: 'POST',
      headers: {
        'content-type': contentType,
        ...(encoding ? { 'content-encoding': encoding } : {}),
        ...signer.sign({ id, body, timestamp: new Date() }),
      },
      body: new Uint8Array(encoding ? gzipSync(body) : body),
    });
  return { post, applied, misconfigured };
}

const parsers: [string, () => Koa.Middleware][] = [
  ['@koa/bodyparser', () => bodyParser()],
  ['koa-body', () => koaBody()],
];

describe.each(parsers)('%s mounted before koaWebhook', (_name, parser) => {
  it.each([
    ['a JSON body', undefined],
    ['a gzip-encoded JSON body', 'gzip'],
  ] as const)('fails closed on %s it parsed: 500 raw_body_required, nothing applied', async (_what, encoding) => {
    const { post, applied, misconfigured } = await start(parser(), 'parser-first');
    const response = await post('E1', 'application/json', encoding);
    expect(response.status).toBe(500);
    expect(await response.json()).toMatchObject({ code: 'raw_body_required' });
    expect(misconfigured.map((error) => error.code)).toEqual(['raw_body_required']);
    expect(applied).toEqual([]);
  });

  it('verifies the bytes of a type it does not read (application/octet-stream): the stream is left to the glue', async () => {
    const { post, applied } = await start(parser(), 'parser-first');
    const response = await post('E2', 'application/octet-stream');
    expect(response.status).toBe(200);
    expect(applied).toEqual(['E2']);
  });
});

describe.each(parsers)('%s mounted after koaWebhook', (_name, parser) => {
  it('verifies a plain and a gzip-encoded delivery over their bytes', async () => {
    const { post, applied } = await start(parser(), 'webhook-first');
    expect((await post('E3', 'application/json')).status).toBe(200);
    expect((await post('E4', 'application/json', 'gzip')).status).toBe(200);
    expect(applied).toEqual(['E3', 'E4']);
  });
});
