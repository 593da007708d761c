// Over HTTP/2 a response has no reason phrase, and reading `statusMessage` off Node's
// `Http2ServerResponse` emits an `UnsupportedWarning` (once a process). The capture settling a keyed
// answer must not read it there: the app never asked for a phrase, and would get Node's warning
// from a read of idem's.
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import Koa from 'koa';
import { expect, it } from 'vitest';
import { h2post } from '../../core/test/support/h2.js';
import { idempotency } from '../src/idempotency.js';

it("HTTP/2: a keyed answer is captured and replayed without reading the response's statusMessage", async () => {
  const reads: number[] = [];
  const app = new Koa();
  app.silent = true;
  app.use(async (ctx, next) => {
    // A spy in place of Node's warning getter (which warns only once a process).
    Object.defineProperty(ctx.res, 'statusMessage', {
      configurable: true,
      get() {
        reads.push(1);
        return '';
      },
      set() {},
    });
    await next();
  });
  app.use(idempotency({ store: memoryStore(), scope: () => 'user_1' }));
  app.use((ctx) => {
    ctx.status = 201;
    ctx.body = { ok: true };
  });
  const server = http2.createServer(
    app.callback() as unknown as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const session = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  session.on('error', () => undefined);
  try {
    const headers = { 'content-type': 'application/json', 'idempotency-key': 'h2-phrase-1' };
    expect((await h2post(session, headers, '{}')).status).toBe(201);
    const replay = await h2post(session, headers, '{}');
    expect(replay.status).toBe(201);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    // Was wrong: the capture read it to learn the handler's phrase, which HTTP/2 does not have.
    expect(reads).toEqual([]);
  } finally {
    session.destroy();
    await new Promise((resolve) => server.close(resolve));
  }
});
