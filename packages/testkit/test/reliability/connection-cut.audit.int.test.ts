// Connections cut while a keyed POST is in flight, on real Express, Fastify and Koa servers (the
// describeAdapter servers) over memoryStore, Redis and PostgreSQL. Here: a client that resets its
// connection while the handler is still running, whose handler then answers with a streamed body.
// The outcome must be settled (stored, or stored as not replayable), the key must not stay in
// progress, and a retry must never get bytes the handler did not send.
import { randomBytes } from 'node:crypto';
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import type { IncomingMessage } from 'node:http';
import net from 'node:net';
import { memoryStore, type Store } from '@idem/core';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { Redis } from 'ioredis';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import {
  type CutServer,
  type FrameworkName,
  newKey,
  requestBytes,
  retryUntilSettled,
  startCutServer,
} from './cut-support.js';
import { databaseUrl, postgresAvailable, redisAvailable, redisUrl } from './support.js';

const available = { redis: await redisAvailable(), postgres: await postgresAvailable() };
const redis = available.redis ? new Redis(redisUrl) : undefined;
redis?.on('error', () => undefined);
const pool = available.postgres ? new pg.Pool({ connectionString: databaseUrl, max: 4 }) : undefined;
pool?.on('error', () => undefined);
const table = `idem_cut_${randomBytes(4).toString('hex')}`;
if (pool) await migrate(pool, { table });
afterAll(async () => {
  if (pool) {
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  }
  if (redis) {
    const keys = await redis.keys('idem-cut:*');
    if (keys.length > 0) await redis.unlink(...keys);
    redis.disconnect();
  }
});

const stores: Array<{ name: string; runs: boolean; make: () => Store }> = [
  { name: 'memory', runs: true, make: () => memoryStore() },
  {
    name: 'redis',
    runs: available.redis,
    make: () => redisStore({ client: redis as Redis, prefix: `idem-cut:${randomBytes(4).toString('hex')}:` }),
  },
  { name: 'postgres', runs: available.postgres, make: () => postgresStore({ client: pool as pg.Pool, table }) },
];

/**
 * Sends a gated POST /stream, resets the connection once the handler runs, then lets the handler
 * answer (a Readable of three chunks, as the adapter table writes it) and retries with the same key
 * until it is no longer 409, for at most 3.5 s (three and a half leases of 1 s).
 */
async function resetWhileStreaming(server: CutServer, key: string) {
  const { bytes } = requestBytes(key, { path: '/stream', body: JSON.stringify({ key, amount: 100, gate: true }) });
  server.gate.reset();
  const socket = net.connect(server.port, '127.0.0.1');
  socket.on('error', () => undefined);
  // The server's end of this connection, from Node's own report of each request it starts (every
  // framework here serves on node:http), so the test can wait for it to close rather than guess.
  // Boxed: a promise resolved with a promise would wait for that one.
  let serverSide!: (side: { closed: Promise<void> }) => void;
  const serverSocket = new Promise<{ closed: Promise<void> }>((resolve) => {
    serverSide = resolve;
  });
  const onRequest = (message: unknown) => {
    const { request } = message as { request: IncomingMessage };
    if (request.socket.remotePort !== socket.localPort) return;
    serverSide({ closed: new Promise<void>((resolve) => request.socket.once('close', () => resolve())) });
  };
  subscribe('http.server.request.start', onRequest);
  try {
    socket.write(bytes);
    await server.gate.started;
    const { closed } = await serverSocket;
    socket.resetAndDestroy();
    // The server saw the reset (its socket closed) before the handler answers.
    await closed;
  } finally {
    unsubscribe('http.server.request.start', onRequest);
  }
  server.gate.open();
  return retryUntilSettled(server.port, bytes, 3500);
}

const streamed = (key: string) => `part-1 of ${key};part-2 run 1;end`;

for (const store of stores) {
  describe.runIf(store.runs)(`connection reset while the handler runs, on ${store.name}`, () => {
    const start = (name: FrameworkName) => startCutServer(name, store.make(), { lease: '1s' });

    it('Express: a streamed answer piped to a response whose client left settles the key (no endless 409)', async () => {
      // Was a defect: Express's `stream.pipe(res)` into a response closed before its head never ends it, and the capture (core http-capture.ts onCapturedClose: closedEarly, no handlerReturned on Express) waits for an end forever while the heartbeat renews the lease, so every retry gets 409.
      const server = await start('express');
      try {
        const key = newKey();
        const { answer } = await resetWhileStreaming(server, key);
        expect(server.runs.get(key)).toHaveLength(1);
        // Settled: either the whole streamed body replayed, or the documented 500 response_not_replayable.
        expect(answer.status).not.toBe(409);
        if (answer.status === 201) expect(answer.body.toString()).toBe(streamed(key));
        else expect(answer.status).toBe(500);
      } finally {
        await server.close();
      }
    });

    it('Fastify: a streamed answer whose client left is never replayed as an empty 201', async () => {
      // Was a defect: an async handler returning `reply.send(stream)` resolves to undefined when the response closes early (FastifyReply is a thenable), so watchReturn (fastify/src/idempotency.ts) takes it for a handler that sent nothing and settleUnsent stores 201 with an empty body.
      const server = await start('fastify');
      try {
        const key = newKey();
        const { answer } = await resetWhileStreaming(server, key);
        expect(server.runs.get(key)).toHaveLength(1);
        if (answer.status === 201) {
          expect(answer.headers['idempotent-replayed']).toBe('true');
          expect(answer.body.toString()).toBe(streamed(key));
        } else {
          expect(answer.status).toBe(500);
          expect(JSON.parse(answer.body.toString())).toMatchObject({ code: 'response_not_replayable' });
        }
      } finally {
        await server.close();
      }
    });
  });
}
