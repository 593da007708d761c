// Claims of docs/scoreboard.md's idem column that no cited test asserted. Each test here is cited
// in the cell it backs.
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { memoryStore, type Store } from '@idem/core';
import { idempotency } from '@idem/koa';
import { redisStore } from '@idem/redis';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import Koa from 'koa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), 'its scoreboard claims');
const prefix = `audit-scoreboard:${randomBytes(4).toString('hex')}:`;
let client: Redis | undefined;

beforeAll(() => {
  if (withRedis) client = new Redis(redisUrl);
});

afterAll(async () => {
  if (client === undefined) return;
  await deleteKeys(client, `${prefix}*`);
  await client.quit();
});

const stores: Array<[string, boolean, () => Store]> = [
  ['the memory store', true, () => memoryStore()],
  ['Redis', withRedis, () => redisStore({ client: client as Redis, prefix })],
];

// Koa 3 streams a body given as a Blob, a web ReadableStream or a Response. A capture that only
// knows strings, buffers, Node streams and JSON would store such a body as "{}" (case 39): the
// retry must get the bytes the first client got.
const webBodies: Record<string, () => unknown> = {
  Blob: () => new Blob(['hello from a blob ✓'], { type: 'text/plain; charset=utf-8' }),
  ReadableStream: () =>
    new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode('hello from '));
        controller.enqueue(new TextEncoder().encode('a web stream ✓'));
        controller.close();
      },
    }),
  // Koa takes a Response's status as the answer's: it says 201 itself.
  Response: () => new Response('hello from a Response ✓', { status: 201, headers: { 'content-type': 'text/plain' } }),
};

for (const [name, available, makeStore] of stores) {
  describe.runIf(available)(`scoreboard claims over ${name}`, () => {
    it('Koa: a Blob, web ReadableStream or Response body is stored and replayed byte for byte, never as "{}" (39)', async () => {
      const store = makeStore();
      for (const [kind, make] of Object.entries(webBodies)) {
        let runs = 0;
        const app = new Koa();
        app.silent = true;
        app.use(idempotency({ store, scope: () => 'tenant-1' }));
        app.use(async (ctx) => {
          runs++;
          ctx.status = 201;
          ctx.body = make();
        });
        const server = app.listen(0, '127.0.0.1');
        await new Promise<void>((resolve) => server.once('listening', () => resolve()));
        const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
        const post = () =>
          fetch(url, {
            method: 'POST',
            headers: { 'idempotency-key': `web-${kind}-${prefix}`, 'content-type': 'application/json' },
            body: '{}',
          });
        try {
          const first = await post();
          const firstBody = Buffer.from(await first.arrayBuffer());
          expect(first.status, kind).toBe(201);
          expect(firstBody.toString(), kind).toMatch(/^hello from .* ✓$/);
          const again = await post();
          expect(again.status, kind).toBe(201);
          expect(again.headers.get('idempotent-replayed'), kind).toBe('true');
          expect(Buffer.from(await again.arrayBuffer()).equals(firstBody), kind).toBe(true);
          expect(again.headers.get('content-type'), kind).toBe(first.headers.get('content-type'));
          expect(runs, kind).toBe(1);
        } finally {
          server.closeAllConnections();
          await new Promise<void>((resolve) => server.close(() => resolve()));
        }
      }
    });
  });
}
