// Audit of the idempotency events of the three adapters over a real Redis (REDIS_URL), with a TCP
// proxy between the app and Redis to make the store fail. docs/operations.md, "Metrics, traces and
// logs", is the contract. Pinned behaviour: these held when probed.
import { randomUUID } from 'node:crypto';
import { redisStore } from '@idem/redis';
import { createTcpProxy, redisAnswers, serviceAvailable, type TcpProxy } from '@idem/testkit';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { frameworks, post, startApp } from './events-harness.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), 'the events audit');
const prefix = `idem-test:events-audit:${randomUUID()}:`;

let proxy: TcpProxy;
let direct: Redis;

beforeAll(async () => {
  if (!withRedis) return;
  const target = new URL(redisUrl);
  direct = new Redis(redisUrl);
  proxy = await createTcpProxy({ target: { host: target.hostname, port: Number(target.port || 6379) } });
});

afterAll(async () => {
  if (!withRedis) return;
  let cursor = '0';
  do {
    const [next, keys] = await direct.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 500);
    if (keys.length > 0) await direct.del(...keys);
    cursor = next;
  } while (cursor !== '0');
  direct.disconnect();
  await proxy.close();
});

describe.skipIf(!withRedis).each(frameworks)('%s over Redis: idempotency events', (framework) => {
  it('100 identical concurrent requests: exactly one claim and one complete, 99 conflicts', async () => {
    const app = await startApp(framework, { store: redisStore({ client: direct, prefix: `${prefix}${framework}:` }) });
    try {
      const answers = Array.from({ length: 100 }, (_, i) =>
        post(app.url, 'same-key', { 'x-mode': 'gate', 'x-req': `r${i}` }),
      );
      await app.next('claim');
      for (;;) {
        const decided = app.events.filter((e) => e.type === 'claim' || e.type === 'conflict').length;
        if (decided >= 100) break;
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
      app.gate.open();
      const all = await Promise.all(answers);
      await app.next('complete');
      expect(all.filter((a) => a.status === 201)).toHaveLength(1);
      expect(all.filter((a) => a.status === 409)).toHaveLength(99);
      const count = (type: string) => app.events.filter((e) => e.type === type).length;
      expect([count('claim'), count('complete'), count('conflict')]).toEqual([1, 1, 99]);
      expect(app.events).toHaveLength(101);
      // Every conflict in its own request's context.
      expect(new Set(app.events.filter((e) => e.type === 'conflict').map((e) => e.context)).size).toBe(99);
    } finally {
      await app.close();
    }
  });

  it('a silent Redis: 503 + Retry-After, one store-error (phase claim) per request, in its context, holding no key', async () => {
    // A client of its own: a blackholed connection never answers the commands it lost.
    const proxied = new Redis({ host: proxy.host, port: proxy.port, maxRetriesPerRequest: 1 });
    const app = await startApp(framework, {
      store: redisStore({ client: proxied, prefix: `${prefix}${framework}-down:` }),
      extra: { storeTimeout: '300ms' },
    });
    try {
      await proxied.ping();
      proxy.blackhole();
      const answers = await Promise.all(
        ['a', 'b', 'c'].map((id) => post(app.url, `KEY-SECRET-${id}`, { 'x-req': id })),
      );
      expect(answers.map((a) => [a.status, a.headers['retry-after']])).toEqual([
        [503, '2'],
        [503, '2'],
        [503, '2'],
      ]);
      expect(app.events.map((e) => e.type)).toEqual(['store-error', 'store-error', 'store-error']);
      expect(app.events.map((e) => e.context).sort()).toEqual(['a', 'b', 'c']);
      for (const e of app.events) expect(e).toMatchObject({ phase: 'claim', operation: 'POST /orders' });
      const text = JSON.stringify(app.events, (_k, v) =>
        v instanceof Error ? { name: v.name, message: v.message, cause: v.cause } : v,
      );
      expect(text).not.toContain('KEY-SECRET');
    } finally {
      proxy.restore();
      proxied.disconnect();
      await app.close();
    }
  });
});
