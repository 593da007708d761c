// The webhook glue served over HTTP/2 (Fastify's `http2: true`, h2c).
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import Fastify from 'fastify';
import { afterEach, expect, it } from 'vitest';
import { createReceiver, createSigner, fastifyWebhook } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"amount":4200}}');

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

// Was a defect: over HTTP/2, a genuine signed delivery that carries neither Content-Type nor
// Content-Length is answered 400 `signature_mismatch` (non-retryable, reported `rejected`) and never
// applied, on every retry: Fastify does not parse a body it believes absent, and
// fastifyWebhookHandler's `hasNoBody` applies the HTTP/1.1 rule "no Content-Length and no
// Transfer-Encoding: no body" (RFC 9112 §6.3), so the signature is checked against zero bytes.
// koaWebhook on `http2.createServer` reads the stream and applies the same request. Expected: the
// body is read and verified, the event applied once (RFC 9113 §8.1.1: in HTTP/2 a body is framed by DATA
// frames and END_STREAM, Content-Length is optional and Transfer-Encoding never sent; the same
// HTTP/1.1 rule was fixed in core's readRequestBody). Fix: when `request.body` is undefined and the
// raw request is HTTP/2 whose stream did not end with its headers, read `request.raw` (readRawBody).
it('HTTP/2 without Content-Type or Content-Length: a signed delivery is verified and applied', async () => {
  const applied: string[] = [];
  const receiver = createReceiver({
    store: memoryStore(),
    secret: SECRET,
    apply: (event) => void applied.push(event.body.toString()),
  });
  const app = Fastify({ http2: true });
  await app.register(fastifyWebhook(receiver, { path: '/hooks' }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  const session = http2.connect(`http://127.0.0.1:${(app.server.address() as AddressInfo).port}`);
  session.on('error', () => undefined);
  closers.push(async () => {
    session.destroy();
    await app.close();
  });
  const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
    const headers = signer.sign({ id: 'evt_h2_1', body, timestamp: new Date() });
    const stream = session.request({ ':method': 'POST', ':path': '/hooks', ...headers });
    let status = 0;
    let text = '';
    stream.setEncoding('utf8');
    stream.on('response', (head) => {
      status = Number(head[':status']);
    });
    stream.on('data', (chunk: string) => {
      text += chunk;
    });
    stream.on('end', () => resolve({ status, body: text }));
    stream.on('error', reject);
    stream.end(body);
  });
  expect(answer.body).not.toContain('signature_mismatch');
  expect(answer.status).toBe(200);
  expect(applied).toEqual([body.toString()]);
});
