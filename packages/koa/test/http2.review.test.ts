// Review of the HTTP/2 body read (readRequestBody, readAvailable, lastBytesIn) as Koa uses it.
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import Koa from 'koa';
import { afterEach, expect, it } from 'vitest';
import { h2post } from '../../core/test/support/h2.js';
import { idempotency } from '../src/idempotency.js';

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

// Was a defect: over HTTP/2, a Koa request whose client resets its stream mid-upload has the bytes so far
// taken for the whole body: readAvailable checks `req.complete` before `lastBytesIn`, and an
// Http2ServerRequest's `complete` is true once it is aborted or closed, so the truncated body is
// resolved `ok`, the key is claimed with its fingerprint and the outcome stored (the CHANGELOG's
// "a stream reset mid-upload ... is now refused body_incomplete" holds only for Fastify's readStream);
// expected: 400 body_incomplete, a `refused` event, nothing claimed, the honest retry runs.
it('HTTP/2 upload reset midway on Koa: nothing is claimed, the retry with the whole body runs', async () => {
  const events: IdempotencyEvent[] = [];
  const bodies: string[] = [];
  let settled!: () => void;
  const settledOnce = new Promise<void>((resolve) => {
    settled = resolve;
  });
  const app = new Koa();
  app.silent = true;
  app.use(
    idempotency({
      store: memoryStore(),
      scope: () => 'user_1',
      onEvent: (event) => {
        events.push(event);
        if (event.type !== 'claim') settled();
      },
    }),
  );
  app.use(async (ctx) => {
    const chunks: Buffer[] = [];
    for await (const chunk of ctx.req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks).toString();
    bodies.push(body);
    ctx.status = 201;
    ctx.body = { charged: body };
  });
  const server = http2.createServer(
    app.callback() as unknown as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  let received!: () => void;
  const firstBytesIn = new Promise<void>((resolve) => {
    received = resolve;
  });
  server.once('stream', (stream: http2.ServerHttp2Stream) => stream.once('data', () => received()));
  const session = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  session.on('error', () => undefined);
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        session.destroy();
        server.close(() => resolve());
      }),
  );
  const headers = { 'content-type': 'text/plain', 'idempotency-key': 'h2-koa-cut-1' };
  const cut = session.request({ ':method': 'POST', ':path': '/charges', ...headers });
  cut.on('error', () => undefined);
  cut.write('amount=1');
  await firstBytesIn;
  cut.destroy(); // RST_STREAM (CANCEL), no END_STREAM
  await settledOnce;
  expect(events.map((event) => event.type)).not.toContain('claim');
  expect(events).toContainEqual(expect.objectContaining({ type: 'refused', code: 'body_incomplete' }));
  const retry = await h2post(session, headers, 'amount=100');
  expect(retry.status).toBe(201);
  expect(bodies).toEqual(['amount=100']);
});
