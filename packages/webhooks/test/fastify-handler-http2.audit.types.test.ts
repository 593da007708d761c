// fastifyWebhookHandler() as its TSDoc mounts it (with a buffer parser), on an HTTP/2 Fastify
// instance (`http2: true`), which the handler serves at run time (http2.audit.test.ts: it reads
// `request.raw` for an HTTP/2 body Fastify left unparsed). This file is type-checked by the
// repository's `tsc -p tsconfig.json --noEmit`; the test runs the same route.
//
// Was a defect: FastifyLikeRequest declared `raw?: IncomingMessage`, an HTTP/1 request, so on an
// `http2: true` instance (whose `request.raw` is an Http2ServerRequest, without `headersDistinct`)
// `app.post(path, fastifyWebhookHandler(receiver))` was TS2769 under `strict`, although the
// handler's own code reads an HTTP/2 raw request. Expected: the handler's types take the request of
// any server Fastify makes; readRawBody() and carriesBody() take Node's HTTP/2 request as well.
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import Fastify from 'fastify';
import { afterEach, expect, it } from 'vitest';
import { createReceiver, createSigner, fastifyWebhookHandler, readRawBody } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded"}');

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

// Types only: Node's own HTTP/2 server, read with readRawBody as on HTTP/1.1.
function typeUses(): void {
  http2.createServer(async (req, res) => {
    res.end(await readRawBody(req, { limit: 1024 }));
  });
}
void typeUses;

it('HTTP/2 (h2c): fastifyWebhookHandler with a buffer parser, typed without a cast, applies a delivery', async () => {
  const applied: string[] = [];
  const receiver = createReceiver({
    store: memoryStore(),
    secret: SECRET,
    apply: (event) => void applied.push(event.id),
  });
  const app = Fastify({ http2: true });
  // On the instance itself: a plugin's `scope` is typed for Fastify's default (HTTP/1) server.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_request, raw, done) => done(null, raw));
  app.post('/hooks', fastifyWebhookHandler(receiver));
  await app.listen({ port: 0, host: '127.0.0.1' });
  const session = http2.connect(`http://127.0.0.1:${(app.server.address() as AddressInfo).port}`);
  session.on('error', () => undefined);
  closers.push(async () => {
    session.destroy();
    await app.close();
  });
  const status = await new Promise<number>((resolve, reject) => {
    const headers = signer.sign({ id: 'evt_h2_handler', body, timestamp: new Date() });
    const stream = session.request({
      ':method': 'POST',
      ':path': '/hooks',
      'content-type': 'application/json',
      ...headers,
    });
    let answered = 0;
    stream.on('response', (head) => {
      answered = Number(head[':status']);
    });
    stream.resume();
    stream.on('end', () => resolve(answered));
    stream.on('error', reject);
    stream.end(body);
  });
  expect(status).toBe(200);
  expect(applied).toEqual(['evt_h2_handler']);
});
