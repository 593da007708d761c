// Exactly-once webhook delivery under connections cut at byte offsets: a cutting proxy between the
// sender and the receiver (Express, Fastify and Koa glue; memoryStore and redisStore), cutting the
// delivery request or the receiver's answer by FIN or RST, then the sender retrying (attempt() again,
// or the outbox relay on PostgreSQL). What must hold: `apply` runs once per event id; a cut attempt
// is recorded as a network error (or as delivered once the 2xx head arrived); the retry is
// acknowledged, as a duplicate with `idempotent-replayed: true` when the first one was applied; and
// the relay dead-letters nothing for a cut alone.
import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { memoryStore, type Store } from '@idem/core';
import { redisStore } from '@idem/redis';
import { type CutHow, createCutProxy } from '@idem/testkit';
import express from 'express';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import Koa from 'koa';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
import {
  createOutbox,
  createReceiver,
  createSender,
  expressWebhook,
  fastifyWebhook,
  koaWebhook,
  type Receiver,
} from '../src/index.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const postgres = await postgresAvailable('connection cut');
const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1 });
redis.on('error', () => undefined);
const prefix = `whcut:${randomBytes(4).toString('hex')}:`;
const closers: (() => Promise<unknown>)[] = [];
const agents: Agent[] = [];
afterAll(async () => {
  for (const close of closers.reverse()) await close().catch(() => undefined);
  await Promise.all(agents.map((agent) => agent.close().catch(() => undefined)));
  const keys = await redis.keys(`${prefix}*`);
  if (keys.length > 0) await redis.del(...keys);
  redis.disconnect();
});

// A connection of its own per attempt: the proxy cuts the next connection, never a pooled one.
const freshFetch = ((url: string, init: RequestInit) => {
  const dispatcher = new Agent();
  agents.push(dispatcher);
  return undiciFetch(url, { ...(init as object), dispatcher } as never);
}) as unknown as typeof fetch;

async function listen(server: Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  closers.push(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return (server.address() as AddressInfo).port;
}

const glue: Record<string, (receiver: Receiver) => Promise<number>> = {
  express: (receiver) => {
    const app = express();
    app.post('/hooks', expressWebhook(receiver));
    return listen(createServer(app));
  },
  fastify: async (receiver) => {
    const app = Fastify();
    app.register(fastifyWebhook(receiver, { path: '/hooks' }));
    await app.listen({ port: 0, host: '127.0.0.1' });
    closers.push(() => app.close());
    return (app.server.address() as AddressInfo).port;
  },
  koa: (receiver) => {
    const app = new Koa();
    // A sender that hung up mid-body is nobody to answer; Koa would log each one.
    app.silent = true;
    app.use(koaWebhook(receiver, { path: '/hooks' }));
    return listen(createServer(app.callback()));
  },
};

const stores: Record<string, () => Store> = {
  memory: () => memoryStore(),
  redis: () => redisStore({ client: redis, prefix: `${prefix}${randomBytes(3).toString('hex')}:` }),
};

/** A receiver behind `framework` and a cutting proxy, counting `apply` runs and outcomes per id. */
async function startCutReceiver(framework: string, store: Store) {
  const applied = new Map<string, number>();
  const outcomes = new Map<string, string[]>();
  const receiver = createReceiver({
    store,
    secret: SECRET,
    apply: (event) => void applied.set(event.id, (applied.get(event.id) ?? 0) + 1),
    onEvent: (event) => {
      if ('id' in event && event.id) outcomes.set(event.id, [...(outcomes.get(event.id) ?? []), event.type]);
    },
  });
  const proxy = await createCutProxy(await glue[framework]!(receiver));
  closers.push(() => proxy.close());
  return { applied, outcomes, proxy, url: `http://127.0.0.1:${proxy.port}/hooks` };
}

/** Every `stride`-th offset up to `total`, and every one of the last 40. */
function offsets(total: number, stride: number): number[] {
  const set = new Set<number>();
  for (let at = 0; at <= total; at += stride) set.add(at);
  for (let at = Math.max(0, total - 40); at <= total; at++) set.add(at);
  return [...set].sort((a, b) => a - b);
}

const replayed = (answer: Buffer) => /\r\nidempotent-replayed: true\r\n/i.test(answer.toString('latin1'));

describe('sender.attempt() through a cut connection, then again', () => {
  for (const framework of Object.keys(glue)) {
    for (const storeName of Object.keys(stores)) {
      it(`${framework} receiver on ${storeName}: apply runs once per id, the retry is acknowledged`, async () => {
        const { applied, outcomes, proxy, url } = await startCutReceiver(framework, stores[storeName]!());
        const sender = createSender({ secret: SECRET, fetch: freshFetch, timeout: '3s' });
        const probe = await sender.attempt({ url, id: 'evt_probe', body: '{"type":"probe","data":{"n":0}}' }, 1);
        expect(probe.result).toBe('delivered');
        const sizes = { request: proxy.last.request, response: proxy.last.response };
        const stride = framework === 'express' && storeName === 'memory' ? 2 : 9;
        let n = 0;
        for (const dir of ['request', 'response'] as const) {
          for (const how of ['fin', 'reset'] as CutHow[]) {
            for (const at of offsets(sizes[dir] - 1, stride)) {
              const where = `${dir} ${how}@${at}/${sizes[dir]}`;
              // Same length as the probe's, so the offsets fall where they were measured.
              const id = `evt_${String(n++).padStart(5, '0')}`;
              const message = { url, id, body: '{"type":"probe","data":{"n":0}}' };
              const cuts = proxy.cuts;
              await proxy.arm(dir, at, how);
              const first = await sender.attempt(message, 1);
              expect(proxy.cuts, `${where}: not cut`).toBe(cuts + 1);
              // A 2xx head that arrived whole is an acknowledgement; anything less is not.
              expect(['network-error', 'delivered'], where).toContain(first.result);
              let retry = await sender.attempt(message, 2);
              for (let attempt = 3; retry.status === 409 && attempt < 50; attempt++) {
                await new Promise((resolve) => setTimeout(resolve, 20));
                retry = await sender.attempt(message, attempt);
              }
              expect(retry.result, `${where}: ${retry.status} ${retry.responseBody}`).toBe('delivered');
              expect(applied.get(id), where).toBe(1);
              const applications = outcomes.get(id) ?? [];
              expect(
                applications.filter((type) => type === 'applied'),
                where,
              ).toHaveLength(1);
              const duplicate = applications.at(-1) === 'duplicate';
              expect(replayed(proxy.last.responseBytes), where).toBe(duplicate);
              if (dir === 'response') expect(duplicate, where).toBe(true);
            }
          }
        }
      }, 300_000);
    }
  }
});

describe.skipIf(!postgres)('outbox relay through a cut connection', () => {
  for (const storeName of Object.keys(stores)) {
    it(`express receiver on ${storeName}: nothing dead-lettered, applied once, retry acknowledged`, async () => {
      const pool = testPool();
      const table = uniqueTable('cut_outbox');
      const outbox = createOutbox({ table });
      await outbox.migrate(pool);
      closers.push(async () => {
        await pool.query(`DROP TABLE IF EXISTS "${table}"`);
        await pool.end();
      });
      const { applied, outcomes, proxy, url } = await startCutReceiver('express', stores[storeName]!());
      const errors: unknown[] = [];
      const sender = createSender({
        secret: SECRET,
        fetch: freshFetch,
        timeout: '3s',
        schedule: { base: '1ms', cap: '2ms', maxAttempts: 5 },
      });
      const relay = outbox.relay({ db: pool, sender, onError: (error) => errors.push(error) });
      const add = async (id: string) => {
        const client = await pool.connect();
        try {
          await client.query('BEGIN');
          await outbox.add(client, { id, url, body: { type: 'probe', data: { n: 0 } } });
          await client.query('COMMIT');
        } finally {
          client.release();
        }
      };
      const row = async (id: string) =>
        (await pool.query(`SELECT status, attempts, last_attempt FROM "${table}" WHERE id = $1`, [id])).rows[0];
      await add('evt_probe');
      await relay.runOnce();
      expect((await row('evt_probe')).status).toBe('delivered');
      const sizes = { request: proxy.last.request, response: proxy.last.response };
      let n = 0;
      for (const dir of ['request', 'response'] as const) {
        for (const how of ['fin', 'reset'] as CutHow[]) {
          for (const at of offsets(sizes[dir] - 1, 13)) {
            const where = `${dir} ${how}@${at}/${sizes[dir]}`;
            const id = `evt_${String(n++).padStart(5, '0')}`;
            await add(id);
            const cuts = proxy.cuts;
            await proxy.arm(dir, at, how);
            await relay.runOnce();
            expect(proxy.cuts, `${where}: not cut`).toBe(cuts + 1);
            const first = await row(id);
            expect(first.status, where).not.toBe('dead');
            if (first.status === 'pending') expect(first.last_attempt.result, where).toBe('network-error');
            let last = first;
            for (let round = 0; round < 20 && last.status === 'pending'; round++) {
              // The schedule's cap: the row is due again by then. A round that finds it not yet due
              // (the database's clock is not ours) only costs one more round.
              await new Promise((resolve) => setTimeout(resolve, 2));
              await relay.runOnce();
              last = await row(id);
            }
            expect(last.status, `${where}: ${JSON.stringify(last.last_attempt)}`).toBe('delivered');
            expect(applied.get(id), where).toBe(1);
            if (first.status === 'pending' && dir === 'response') {
              expect(outcomes.get(id), where).toEqual(['applied', 'duplicate']);
              expect(replayed(proxy.last.responseBytes), where).toBe(true);
            }
          }
        }
      }
      expect(errors).toEqual([]);
    }, 300_000);
  }
});
