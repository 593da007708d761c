// An empty body sent chunked: `Transfer-Encoding: chunked` and only the last chunk (`0\r\n\r\n`), as
// curl `-T -` sends an empty stdin and any client streaming a body of unknown length sends one that
// turns out empty. The middleware reads the body first; with nothing to put back, the request's
// 'end' went out before the body parser listened, and the parser found the request closed.
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import Koa from 'koa';
import { expect, it } from 'vitest';
import { postEmptyChunked } from '../../core/test/support/empty-chunked.js';
import { idempotency } from '../src/idempotency.js';

// Loaded by specifiers TypeScript does not follow (see bodyparser.test.ts).
const modules: string[] = ['@koa/bodyparser', 'koa-body'];
const [{ bodyParser }, { koaBody }] = (await Promise.all(modules.map((name) => import(name)))) as [
  { bodyParser: () => Koa.Middleware },
  { koaBody: () => Koa.Middleware },
];

for (const [name, parser] of [
  ['@koa/bodyparser', () => bodyParser()],
  ['koa-body', () => koaBody()],
] as const) {
  it(`an empty chunked body reaches ${name} as an empty body, in one packet with its head or after it`, async () => {
    const app = new Koa();
    app.silent = true;
    let runs = 0;
    app.use(idempotency({ store: memoryStore(), scope: () => 'caller' }));
    app.use(parser());
    app.use((ctx) => {
      runs++;
      ctx.status = 201;
      ctx.body = { body: (ctx.request as { body?: unknown }).body ?? null };
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    const { port } = server.address() as AddressInfo;
    try {
      for (const later of [false, true]) {
        const key = randomUUID();
        expect(await postEmptyChunked(port, key, later), `later: ${later}`).toBe('HTTP/1.1 201 Created {"body":{}}');
        // The retry is the same request: replayed, not run again.
        expect(await postEmptyChunked(port, key, later), `later: ${later}`).toBe('HTTP/1.1 201 Created {"body":{}}');
      }
      expect(runs).toBe(2);
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
}
