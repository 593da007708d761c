import type { AddressInfo } from 'node:net';
import { type IdempotencyEvent, memoryStore } from '@idem/core';
import { idempotency, type KoaIdempotencyOptions } from '@idem/koa';
import Koa from 'koa';
import { describe, expect, it } from 'vitest';

async function serve(
  options: Partial<KoaIdempotencyOptions>,
  handler: Koa.Middleware,
  run: (url: string) => Promise<void>,
) {
  const app = new Koa();
  app.silent = true;
  app.use(async (ctx, next) => {
    ctx.set('access-control-allow-origin', 'https://app.example');
    await next();
  });
  app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', ...options }));
  app.use(handler);
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  try {
    await run(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

const post = (url: string, key: string) =>
  fetch(url, { method: 'POST', headers: { 'idempotency-key': key, 'content-type': 'application/json' }, body: '{}' });

describe('@idem/koa specifics', () => {
  it("knows when the handler threw: policy 'stripe' releases the key instead of storing the 500", async () => {
    let runs = 0;
    const events: IdempotencyEvent[] = [];
    await serve(
      { storeOutcome: 'stripe', onEvent: (event) => events.push(event) },
      async () => {
        runs++;
        throw new Error('failed');
      },
      async (url) => {
        expect((await post(url, 'b-1')).status).toBe(500);
        const again = await post(url, 'b-1');
        expect(again.status).toBe(500);
        expect(again.headers.get('idempotent-replayed')).toBeNull();
        expect(runs).toBe(2);
        expect(events.filter((event) => event.type === 'not-stored').length).toBe(2);
      },
    );
  });

  it('exposes the execution on ctx.state.idempotency (key, minted)', async () => {
    await serve(
      {},
      async (ctx) => {
        ctx.status = 201;
        ctx.body = { key: ctx.state.idempotency.key, minted: ctx.state.idempotency.minted };
      },
      async (url) => {
        const first = await post(url, '"k-1"');
        expect(await first.json()).toEqual({ key: 'k-1', minted: false });
        const again = await post(url, '"k-1"');
        expect(again.status).toBe(201);
        expect(again.headers.get('idempotent-replayed')).toBe('true');
        // Headers earlier middleware set (CORS) stay on replays and problems.
        expect(again.headers.get('access-control-allow-origin')).toBe('https://app.example');
        const problem = await fetch(url, { method: 'POST', body: '{}' });
        expect(problem.status).toBe(400);
        expect(problem.headers.get('access-control-allow-origin')).toBe('https://app.example');
      },
    );
  });
});
