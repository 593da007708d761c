// Adversarial review of `lease_lost` once the head went out: a handler that wrote part of its body,
// then stopped on its lost lease (it threw, or destroyed its hijacked response, with the signal's
// reason). Real Redis and sockets; the lease is lost by taking the record away (the next renewal is
// refused), and the test waits for the signal, not for a TTL.
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { IdempotencyEvent } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { redisStore } from '@idem/redis';
import express from 'express';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { deleteKeys, redisAvailable, redisUrl } from '../../redis/test/redis-env.js';

const available = await redisAvailable();

interface Answer {
  status: number;
  body: string;
  replayed?: string | string[] | undefined;
  error?: string;
}

const post = (port: number, key: string) =>
  new Promise<Answer>((resolve, reject) => {
    const headers = { 'idempotency-key': key };
    const req = httpRequest({ host: '127.0.0.1', port, path: '/a', method: 'POST', agent: false, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        body += chunk;
      });
      const status = res.statusCode ?? 0;
      res.on('end', () => resolve({ status, body, replayed: res.headers['idempotent-replayed'] }));
      res.on('error', (error) => resolve({ status, body, error: error.message }));
    });
    req.on('error', reject);
    req.end();
  });

const whenAborted = (signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener('abort', () => resolve(), { once: true });
  });

type Mode =
  | 'express: thrown after a write'
  | 'fastify: thrown after a raw write'
  | 'fastify: a hijacked response destroyed';

describe.runIf(available)('a handler stopping on its lost lease after its head went out (Redis)', () => {
  const prefix = `audit-review2:lease-head:${randomBytes(4).toString('hex')}:`;
  const client = new Redis(redisUrl);
  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  const modes: Mode[] = [
    'express: thrown after a write',
    'fastify: thrown after a raw write',
    'fastify: a hijacked response destroyed',
  ];
  for (const [index, mode] of modes.entries()) {
    // Held: the client's response is cut (it never got a whole answer), nothing is stored, and the
    // retry runs the operation, nobody else holding the key.
    it(`${mode}: the response is cut, nothing stored, the retry runs`, async () => {
      const events: IdempotencyEvent[] = [];
      const scoped = `${prefix}${index}:`;
      const options = {
        store: redisStore({ client, prefix: scoped }),
        scope: () => 't',
        lease: '300ms' as const,
        onEvent: (event: IdempotencyEvent) => events.push(event),
      };
      let runs = 0;
      let port: number;
      let close: () => Promise<unknown>;
      if (mode.startsWith('express')) {
        const app = express();
        app.use(expressIdempotency(options));
        app.post('/a', async (req, res, next) => {
          runs++;
          if (runs > 1) {
            res.status(201).send('second');
            return;
          }
          const signal = (req.idempotency as { signal: AbortSignal }).signal;
          res.writeHead(200, { 'content-type': 'text/plain' });
          res.write('part');
          await whenAborted(signal);
          try {
            signal.throwIfAborted();
          } catch (error) {
            next(error);
          }
        });
        app.use(idempotencyErrors());
        const server = app.listen(0, '127.0.0.1');
        await once(server, 'listening');
        port = (server.address() as AddressInfo).port;
        close = async () => {
          server.closeAllConnections();
          await new Promise((resolve) => server.close(resolve));
        };
      } else {
        const app = Fastify();
        await app.register(fastifyIdempotency, options);
        app.post('/a', { config: { idempotency: {} } }, async (request, reply) => {
          runs++;
          if (runs > 1) return reply.code(201).send('second');
          const signal = (request as unknown as { idempotency: { signal: AbortSignal } }).idempotency.signal;
          if (mode === 'fastify: a hijacked response destroyed') {
            reply.hijack();
            reply.raw.writeHead(200);
            reply.raw.write('part');
            void whenAborted(signal).then(() => reply.raw.destroy(signal.reason as Error));
            return reply;
          }
          reply.raw.writeHead(200);
          reply.raw.write('part');
          await whenAborted(signal);
          signal.throwIfAborted();
          return reply;
        });
        await app.listen({ port: 0, host: '127.0.0.1' });
        port = (app.server.address() as AddressInfo).port;
        close = () => app.close();
      }
      try {
        const sending = post(port, 'head-1');
        await expect.poll(() => events.some((event) => event.type === 'claim'), { timeout: 5_000 }).toBe(true);
        await deleteKeys(client, scoped);
        const first = await sending;
        expect([first.status, first.body, first.error]).toEqual([200, 'part', 'aborted']);
        await expect
          .poll(() => events.some((event) => event.type === 'response-not-stored'), { timeout: 5_000 })
          .toBe(true);
        const retry = await post(port, 'head-1');
        expect([retry.status, retry.body, retry.replayed]).toEqual([201, 'second', undefined]);
        expect(runs).toBe(2);
        expect(events.filter((event) => event.type === 'complete')).toHaveLength(1);
      } finally {
        await close();
      }
    }, 20_000);
  }
});
