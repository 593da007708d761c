// Audit of the client's 409 handling against the real stack: @idem/express on the Redis store, a real
// server on an ephemeral port, and the canonical client flow of stripe-node and the IETF draft: an
// attempt times out while the handler still runs, the retry with the same key gets 409 (in
// progress), backs off, and then gets the stored outcome. What the audit checked and found right.
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createClient } from '@idem/client';
import { idempotency } from '@idem/express';
import { redisStore } from '@idem/redis';
import express from 'express';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys, redisAvailable, redisUrl } from '../../redis/test/redis-env.js';
import { fakeTime } from './support/fake-time.js';

const prefix = `audit-client:${randomBytes(4).toString('hex')}:`;
const servers: Server[] = [];

afterEach(async () => {
  await Promise.all(
    servers.splice(0).map(async (server) => {
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    }),
  );
});

describe.runIf(await redisAvailable())('the client against @idem/express on Redis', () => {
  let redis: Redis;
  beforeAll(() => {
    redis = new Redis(redisUrl);
  });
  afterAll(async () => {
    await deleteKeys(redis, prefix);
    await redis.quit();
  });

  /** POST /charges behind idempotency(); each charge waits for `release()` before answering. */
  async function startApp(scenario: string) {
    let runs = 0;
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let entered!: () => void;
    const running = new Promise<void>((resolve) => {
      entered = resolve;
    });
    let completions = 0;
    const app = express();
    app.post(
      '/charges',
      idempotency({
        store: redisStore({ client: redis, prefix: `${prefix}${scenario}:` }),
        scope: (req) => req.get('authorization')?.replace(/^Bearer /, ''),
        storeTimeout: '15s',
        onEvent: (event) => {
          if (event.type === 'complete') completions++;
        },
      }),
      express.json(),
      async (req, res) => {
        runs++;
        entered();
        await released;
        res.status(201).json({ id: `ch_${runs}`, amount: req.body.amount });
      },
    );
    const server = app.listen(0, '127.0.0.1');
    servers.push(server);
    await once(server, 'listening');
    return {
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      runs: () => runs,
      completions: () => completions,
      running,
      release,
    };
  }

  it('timeout, then 409 in progress, then the replay: one run, one key, the replay surfaced', async () => {
    const app = await startApp('timeout-409');
    const time = fakeTime();
    // The first wait follows the timed-out attempt: the handler still runs, so the retry meets 409.
    // The second follows that 409: let the handler finish and its outcome be stored, then retry.
    let sleeps = 0;
    time.onSleep(async () => {
      if (++sleeps !== 2) return;
      app.release();
      await expect.poll(app.completions, { timeout: 10_000 }).toBe(1);
    });
    const client = createClient({
      baseUrl: app.url,
      getToken: () => 'user-1',
      random: () => 0,
      sleep: time.sleep,
      now: time.now,
      // The per-attempt timeout runs on a real timer; the handler waits far longer (until released).
      // It bounds the 409 and the replay too, each a trip through Express and Redis: 500 ms was a
      // thin margin on a loaded box. Two seconds are waited once, by the first attempt.
      retry: { timeout: 2_000 },
    });
    const result = await client.post<{ id: string; amount: number }>('/charges', { amount: 700 });
    expect(result.attempts.map((a) => [a.outcome, a.status])).toEqual([
      ['timeout', undefined],
      ['response', 409],
      ['response', 201],
    ]);
    // Retry-After: 1 on the engine's 409 is a floor over the zero backoff.
    expect(result.attempts[1]?.retryAfterMs).toBe(1_000);
    expect(time.waits).toEqual([0, 1_000]);
    expect(result.replayed).toBe(true);
    expect(result.body).toEqual({ id: 'ch_1', amount: 700 });
    expect(new Set(result.attempts.map((a) => a.key))).toEqual(new Set([result.key]));
    expect(app.runs()).toBe(1);
  });

  it('two calls with one stored key, the second while the first runs: it waits out the 409s for the replay', async () => {
    const app = await startApp('two-calls');
    const time = fakeTime();
    time.onSleep(async () => {
      app.release();
      await expect.poll(app.completions, { timeout: 10_000 }).toBe(1);
    });
    const client = createClient({ baseUrl: app.url, getToken: () => 'user-1', sleep: time.sleep, now: time.now });
    const first = client.post('/charges', { amount: 5 }, { idempotencyKey: 'order-7-charge' });
    await app.running;
    const second = await client.post('/charges', { amount: 5 }, { idempotencyKey: 'order-7-charge' });
    const firstResult = await first;
    expect([firstResult.status, firstResult.replayed, firstResult.attempts.length]).toEqual([201, false, 1]);
    expect([second.status, second.replayed, second.attempts.map((a) => a.status)]).toEqual([201, true, [409, 201]]);
    expect(second.body).toEqual(firstResult.body);
    expect(app.runs()).toBe(1);
  });
});
