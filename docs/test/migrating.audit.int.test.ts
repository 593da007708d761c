// Audit of docs/migrating.md as a newcomer reads it: each row of its "from X" tables that maps an
// option or a behaviour of the other library to idem, checked against what idem does (Express over
// the memory store where the store plays no part, `makeIdempotent` over the real Redis where it
// does). Each test reads its row from the page, so a reworded row fails here rather than drifting.
import { readFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createIdempotency, makeIdempotent, memoryStore, type Store } from '@idem/core';
import { idempotency } from '@idem/express';
import { redisStore } from '@idem/redis';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import express from 'express';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'migrating.md'), 'utf8');

/** The cells of the first table row of the page whose first cell starts with `first`. */
function row(first: string): string[] {
  const line = page.split('\n').find((text) => text.startsWith(`| ${first}`));
  if (line === undefined) throw new Error(`docs/migrating.md has no row starting "${first}": revisit this audit`);
  return line
    .split('|')
    .slice(1, -1)
    .map((cell) => cell.trim());
}

async function serve(app: express.Express, run: (url: string) => Promise<void>): Promise<void> {
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  try {
    await run(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

const post = (url: string, key: string) => fetch(url, { method: 'POST', headers: { 'idempotency-key': key } });

describe('docs/migrating.md, From express-idempotency', () => {
  // Row "Same key, other path". Was wrong: it said the request always runs, "the key is scoped to the
  // operation (method and route template)". Two paths of one route template (`/orders/:id`) are one
  // operation: mounted on that route, the second path under the key is another request of the same
  // operation, refused 422 (as express-idempotency's intent check refused it 417). Only where the
  // middleware is mounted with `app.use` (the page's After block) is the operation the concrete path.
  it('the same key on another path: runs when mounted app-wide, 422 when both paths are one route template', async () => {
    let runs = 0;
    const handler: express.RequestHandler = (req, res) => {
      runs++;
      res.status(201).json({ id: req.params.id });
    };
    const appWide = express();
    appWide.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1' }));
    appWide.post('/orders/:id', handler);
    await serve(appWide, async (url) => {
      expect((await post(`${url}/orders/1`, '"k"')).status).toBe(201);
      expect((await post(`${url}/orders/2`, '"k"')).status).toBe(201);
    });
    expect(runs).toBe(2);

    const perRoute = express();
    perRoute.post('/orders/:id', idempotency({ store: memoryStore(), scope: () => 'tenant-1' }), handler);
    await serve(perRoute, async (url) => {
      expect((await post(`${url}/orders/1`, '"k"')).status).toBe(201);
      const other = await post(`${url}/orders/2`, '"k"');
      expect(other.status).toBe(422);
      expect(await other.json()).toMatchObject({ code: 'fingerprint_mismatch' });
    });
    expect(runs).toBe(3);

    const idem = row('Same key, other path')[2] ?? '';
    expect(idem).toMatch(/app\.use/);
    expect(idem).toMatch(/422/);
  });

  // Row "Hit flag": nothing a client sends marks a request as a replay (express-idempotency trusted
  // an `x-hit` request header).
  it('a client-sent x-hit header neither skips the handler nor marks the answer replayed', async () => {
    let runs = 0;
    const app = express();
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1' }));
    app.post('/orders', (_req, res) => {
      runs++;
      res.status(201).json({ ok: true });
    });
    await serve(app, async (url) => {
      const answer = await fetch(`${url}/orders`, {
        method: 'POST',
        headers: { 'idempotency-key': '"h"', 'x-hit': 'true', 'idempotent-replayed': 'true' },
      });
      expect(answer.status).toBe(201);
      expect(answer.headers.get('idempotent-replayed')).toBeNull();
    });
    expect(runs).toBe(1);
    expect(row('Hit flag')[2]).toMatch(/nothing a client sends/);
  });
});

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const withRedis = serviceAvailable(
  `Redis at ${redisUrl}`,
  await redisAnswers(redisUrl),
  'the migrating audit on Redis',
);
const prefix = `audit-docsnewcomer:migrating:${process.pid}:${Date.now()}:`;

describe('docs/migrating.md, From Powertools', () => {
  // Row "A returned error ({ statusCode: 500 })". Was wrong for `makeIdempotent`, the page's own
  // recipe for a Powertools function: it said such a result is "released under 'success'". The
  // wrapper knows nothing of a `statusCode` field: whatever the function returns is its result,
  // stored (as status 200) under every policy, and a redelivery replays it without running again.
  // Only a throw is a failure there. The row now tells the two apart.
  it("makeIdempotent stores a returned { statusCode: 500 } under 'success' too; only a throw is released", async () => {
    let runs = 0;
    const engine = createIdempotency({ store: memoryStore(), storeOutcome: 'success' });
    const handle = makeIdempotent(
      async () => {
        runs++;
        return { statusCode: 500 };
      },
      { engine, operation: 'processOrder', key: () => 'order-1', payload: () => 'order-1' },
    );
    expect(await handle(undefined)).toEqual({ statusCode: 500 });
    expect(await handle(undefined)).toEqual({ statusCode: 500 });
    expect(runs).toBe(1);

    let thrown = 0;
    const failing = makeIdempotent(
      async () => {
        thrown++;
        throw new Error('card declined');
      },
      { engine, operation: 'failing', key: () => 'order-2', payload: () => 'order-2' },
    );
    await expect(failing(undefined)).rejects.toThrow('card declined');
    await expect(failing(undefined)).rejects.toThrow('card declined');
    expect(thrown).toBe(2);

    const idem = row('A returned error')[2] ?? '';
    expect(idem).toMatch(/makeIdempotent/);
    expect(idem).toMatch(/every policy/);
  });

  // Row "`responseHook`". Was wrong for `makeIdempotent`: "built in, `Idempotent-Replayed: true` on
  // every replay" is the adapters' header; the wrapper returns the same value either way, and what
  // tells a replay apart is the engine's `replay` event.
  it("makeIdempotent marks no replay in its result; the engine's onEvent reports it, with the operation", async () => {
    const events: Array<{ type: string; operation: string }> = [];
    const engine = createIdempotency({ store: memoryStore(), onEvent: (event) => events.push(event) });
    const handle = makeIdempotent(async () => ({ chargeId: 'ch_1' }), {
      engine,
      operation: 'processOrder',
      key: () => 'order-1',
      payload: () => 'order-1',
    });
    const first = await handle(undefined);
    expect(await handle(undefined)).toEqual(first);
    expect(events.filter((event) => event.type === 'replay')).toEqual([
      expect.objectContaining({ type: 'replay', operation: 'processOrder' }),
    ]);
    expect(row('`responseHook`').join(' ')).toMatch(/makeIdempotent[^|]*`onEvent`/);
  });

  // Row "`throwOnNoIdempotencyKey`". Was incomplete: it mapped the option to the adapters' `required`
  // only. `makeIdempotent` has no such option: a message without a key is refused `key_missing`
  // before any claim, and never runs unprotected (Powertools' default).
  it('makeIdempotent refuses a message without a key before any claim: key_missing, the handler not run', async () => {
    let runs = 0;
    const handle = makeIdempotent(
      async () => {
        runs++;
      },
      {
        engine: createIdempotency({ store: memoryStore() }),
        operation: 'processOrder',
        key: (order: { id?: string }) => order.id as string,
        payload: () => '',
      },
    );
    await expect(handle({})).rejects.toMatchObject({ code: 'key_missing' });
    expect(runs).toBe(0);
    expect(row('`throwOnNoIdempotencyKey`').join(' ')).toMatch(/makeIdempotent[^|]*key_missing/);
  });

  describe.skipIf(!withRedis)('over Redis', () => {
    const client = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 });
    afterAll(async () => {
      const keys = await client.keys(`${prefix}*`);
      if (keys.length > 0) await client.del(...keys);
      await client.quit();
    });

    /** The Redis store, with a count of the calls the engine makes on it (each goes to Redis). */
    function counted(store: Store): { store: Store; calls: () => number } {
      let calls = 0;
      const wrapped = new Proxy(store, {
        get(target, name, receiver) {
          const value = Reflect.get(target, name, receiver);
          if (typeof value !== 'function') return value;
          return (...args: unknown[]) => {
            calls++;
            return value.apply(target, args);
          };
        },
      });
      return { store: wrapped, calls: () => calls };
    }

    // Row "`useLocalCache`, `maxLocalCacheSize`". Was wrong: it said "(none needed)", as if the
    // engine answered repeats without the store. It does so only for a key this process is still
    // executing; Powertools' local cache is for completed records, its warm hits, and idem's
    // equivalent is the engine's `replayCache` (off by default): without it every replay is a store
    // round trip.
    it('a replay of a completed key is a store call, unless replayCache is set', async () => {
      await client.connect();
      const run = async (replayCache: { ttl: string } | undefined) => {
        const { store, calls } = counted(
          redisStore({ client, prefix: `${prefix}${replayCache ? 'cached' : 'plain'}:` }),
        );
        const engine = createIdempotency({ store, ...(replayCache ? { replayCache: { ttl: '1s' } } : {}) });
        const handle = makeIdempotent(async (order: { id: string }) => ({ charged: order.id }), {
          engine,
          operation: 'processOrder',
          key: (order) => order.id,
          payload: (order) => JSON.stringify(order),
        });
        await handle({ id: 'order-1' });
        const before = calls();
        expect(await handle({ id: 'order-1' })).toEqual({ charged: 'order-1' });
        return calls() - before;
      };
      expect(await run(undefined)).toBeGreaterThan(0);
      expect(await run({ ttl: '1s' })).toBe(0);

      const [powertools, idem] = row('`useLocalCache`, `maxLocalCacheSize`');
      expect(powertools).toBeDefined();
      expect(idem).toMatch(/replayCache/);
    });
  });
});
