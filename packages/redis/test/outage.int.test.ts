import { randomUUID } from 'node:crypto';
import { createIdempotency, type IdempotencyEngine } from '@idem/core';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RedisClientLike, redisStore } from '../src/index.js';
import { freePort, redisBinariesAvailable } from './redis-env.js';
import { type RedisServerProcess, startRedisServer } from './redis-server.js';

// These tests stop and pause a redis-server of their own (never the shared one) under load.
const withBinaries = await redisBinariesAvailable();

const STORE_TIMEOUT_MS = 300;
// A request may spend one storeTimeout on begin and two on complete (complete, then release).
// Anything still pending well after that is a hang.
const HANG_AFTER_MS = STORE_TIMEOUT_MS * 3 + 1_500;
// The longest the tests wait for the load to reach a milestone before failing.
const MILESTONE_MS = 30_000;

type Outcome = 'stored' | 'served-not-stored' | 'unavailable' | 'hang' | `other:${string}`;

/** Keeps `loops` request loops running against the engine, each request with a fresh key. */
function startLoad(engine: IdempotencyEngine, loops = 8) {
  const counts = new Map<Outcome, number>();
  let executions = 0;
  let stopped = false;
  const waiters = new Set<() => void>();

  const request = async (): Promise<Outcome> => {
    const started = await engine.begin({
      key: randomUUID(),
      scope: 'user:1',
      operation: 'POST /orders',
      fingerprint: 'fp',
    });
    if (started.kind === 'reject')
      return started.error.code === 'store_unavailable' ? 'unavailable' : `other:${started.error.code}`;
    if (started.kind === 'replay') return 'other:replay';
    executions++;
    const completed = await engine.complete(started.lease, { status: 201, headers: {}, body: new Uint8Array([1]) });
    if (completed.ok) return 'stored';
    // The handler ran and its response is served; only storing it failed (Redis went away meanwhile).
    return completed.reason === 'store-error' ? 'served-not-stored' : `other:${completed.reason}`;
  };

  const bounded = (): Promise<Outcome> => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const hang = new Promise<Outcome>((resolve) => {
      timer = setTimeout(() => resolve('hang'), HANG_AFTER_MS);
    });
    return Promise.race([
      request().catch((error: unknown) => `other:thrown ${String(error)}` as Outcome),
      hang,
    ]).finally(() => clearTimeout(timer));
  };

  const loop = async () => {
    while (!stopped) {
      const outcome = await bounded();
      counts.set(outcome, (counts.get(outcome) ?? 0) + 1);
      for (const wake of waiters) wake();
    }
  };
  const running = Promise.all(Array.from({ length: loops }, loop));
  const count = (outcome: Outcome) => counts.get(outcome) ?? 0;

  return {
    count,
    counts: () => Object.fromEntries(counts),
    executions: () => executions,
    /** Resolves once `reached()` holds (checked after every request); fails after MILESTONE_MS. */
    until(what: string, reached: () => boolean): Promise<void> {
      return new Promise((resolve, reject) => {
        const deadline = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`load never reached: ${what} (${JSON.stringify(Object.fromEntries(counts))})`));
        }, MILESTONE_MS);
        const check = () => {
          if (!reached()) return;
          clearTimeout(deadline);
          waiters.delete(check);
          resolve();
        };
        waiters.add(check);
        check();
      });
    },
    async stop() {
      stopped = true;
      await running;
    },
  };
}

const clients = [
  {
    name: 'ioredis (default options: offline queue, reconnect)',
    connect: async (url: string) => {
      const client = new Redis(url);
      client.on('error', () => undefined);
      return { client: client as RedisClientLike, close: async () => client.disconnect() };
    },
  },
  {
    name: 'node-redis (default options: offline queue, reconnect)',
    connect: async (url: string) => {
      const client = createClient({ url });
      client.on('error', () => undefined);
      await client.connect();
      return { client: client as RedisClientLike, close: async () => client.destroy() };
    },
  },
];

describe.runIf(withBinaries).each(clients)('Redis outage under load with $name', ({ connect }) => {
  let server: RedisServerProcess;
  let port: number;
  let connection: Awaited<ReturnType<typeof connect>>;
  let admin: Redis;
  let engine: IdempotencyEngine;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);

  beforeAll(async () => {
    process.on('unhandledRejection', onUnhandled);
    port = await freePort();
    server = await startRedisServer(port);
    connection = await connect(server.url);
    admin = new Redis(port, '127.0.0.1', { retryStrategy: () => 100 });
    admin.on('error', () => undefined);
    engine = createIdempotency({
      store: redisStore({ client: connection.client, prefix: 'outage:' }),
      storeTimeout: STORE_TIMEOUT_MS,
    });
  });
  afterAll(async () => {
    process.off('unhandledRejection', onUnhandled);
    await connection?.close();
    admin?.disconnect();
    await server?.stop();
  });

  const allowed = (counts: Record<string, number>) =>
    Object.keys(counts).filter((outcome) => !['stored', 'served-not-stored', 'unavailable'].includes(outcome));

  it('stopped Redis: only 503s and successes, no hangs, recovery after a restart', async () => {
    const load = startLoad(engine);
    try {
      await load.until('200 stored outcomes before the outage', () => load.count('stored') >= 200);
      await server.stop({ hard: true });
      const unavailableBefore = load.count('unavailable');
      await load.until(
        '50 store_unavailable answers during the outage',
        () => load.count('unavailable') >= unavailableBefore + 50,
      );
      server = await startRedisServer(port);
      const storedBefore = load.count('stored');
      await load.until('200 stored outcomes after the restart', () => load.count('stored') >= storedBefore + 200);
    } finally {
      await load.stop();
    }
    const counts = load.counts();
    expect(allowed(counts)).toEqual([]);
    expect(counts.hang ?? 0).toBe(0);
    // The handler ran only for claimed keys: every execution ended stored or served-not-stored.
    expect(load.executions()).toBe(load.count('stored') + load.count('served-not-stored'));
    expect(unhandled).toEqual([]);
  });

  it('paused Redis (CLIENT PAUSE WRITE): 503 within the store timeout, recovery after unpause', async () => {
    const load = startLoad(engine);
    try {
      await load.until('100 stored outcomes before the pause', () => load.count('stored') >= 100);
      // WRITE mode holds every script call while letting this connection send CLIENT UNPAUSE.
      await admin.call('CLIENT', 'PAUSE', '60000', 'WRITE');
      const unavailableBefore = load.count('unavailable');
      await load.until(
        '50 store_unavailable answers while paused',
        () => load.count('unavailable') >= unavailableBefore + 50,
      );
      await admin.call('CLIENT', 'UNPAUSE');
      const storedBefore = load.count('stored');
      await load.until('200 stored outcomes after the unpause', () => load.count('stored') >= storedBefore + 200);
    } finally {
      await admin.call('CLIENT', 'UNPAUSE').catch(() => undefined);
      await load.stop();
    }
    const counts = load.counts();
    expect(allowed(counts)).toEqual([]);
    expect(counts.hang ?? 0).toBe(0);
    expect(load.executions()).toBe(load.count('stored') + load.count('served-not-stored'));
    expect(unhandled).toEqual([]);
  });
});
