// curl and Python's http.client against Express, Fastify and Koa on one real Redis store (its own key
// prefix): the replays they get from Redis are the ones they get from the memory store
// (interop-clients.audit.test.ts), and a Redis that cannot be reached is 503 + Retry-After
// problem+json on all three, the handler never run.
import { randomBytes, randomUUID } from 'node:crypto';
import { type AddressInfo, createServer } from 'node:net';
import { redisStore } from '@idem/redis';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteKeys } from '../../redis/test/redis-env.js';
import {
  curl,
  frameworkNames,
  hasCurl,
  hasPython,
  python,
  type Servers,
  startServers,
  tokenFor,
} from './audit-support/interop-clients.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const withRedis = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), 'the interop clients over it');
const prefix = `idem-test:interop-audit:${randomBytes(4).toString('hex')}:`;
// Shared services on a small box: a slow answer must not read as an unreachable store.
const storeTimeout = '15s';

/** A port that was free a moment ago and has no listener. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

const post = (key: string, ...rest: string[]) => [
  '-X',
  'POST',
  '-H',
  `Authorization: Bearer ${tokenFor('user-1')}`,
  '-H',
  `Idempotency-Key: ${key}`,
  ...rest,
];

describe.runIf(withRedis)('non-Node clients, one Redis store behind the three frameworks', () => {
  let client: Redis;
  let offline: Redis;
  let servers: Servers;
  let down: Servers;
  beforeAll(async () => {
    client = new Redis(redisUrl);
    servers = await startServers(redisStore({ client, prefix }), { storeTimeout });
    // A Redis that is gone (a port nothing listens on, as during an outage) and a client that queues
    // nothing: every command fails at once.
    offline = new Redis(await closedPort(), '127.0.0.1', {
      lazyConnect: true,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
    });
    offline.on('error', () => undefined);
    down = await startServers(redisStore({ client: offline, prefix }));
  });
  afterAll(async () => {
    await servers?.close();
    await down?.close();
    offline?.disconnect();
    if (client !== undefined) {
      await deleteKeys(client, prefix);
      await client.quit();
    }
  });

  it.skipIf(!hasCurl).each(frameworkNames)(
    '%s: a chunked answer replays from Redis to HTTP/1.0 with Content-Length; a chunked upload replays',
    async (framework) => {
      const base = `http://127.0.0.1:${servers.ports[framework]}`;
      const key = randomUUID();
      const first = await curl([...post(key, '--http1.1', '-d', 'x=1'), `${base}/stream`]);
      expect(first.headers['transfer-encoding']).toBe('chunked');
      const old = await curl([...post(key, '--http1.0', '-d', 'x=1'), `${base}/stream`]);
      expect(old).toMatchObject({ exit: 0, status: 200 });
      expect(old.body.equals(first.body)).toBe(true);
      expect(old.headers).toMatchObject({
        'content-length': String(first.body.length),
        connection: 'close',
        'idempotent-replayed': 'true',
        'cache-control': 'no-store',
        'idempotency-key': key,
      });
      const bytes = randomBytes(200_000);
      const upload = randomUUID();
      const sent = await curl(
        [...post(upload, '-H', 'Content-Type: application/octet-stream', '-T', '-'), `${base}/charges`],
        bytes,
      );
      expect(sent.status).toBe(201);
      const again = await curl(
        [...post(upload, '-H', 'Content-Type: application/octet-stream', '-T', '-'), `${base}/charges`],
        bytes,
      );
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(again.body.equals(sent.body)).toBe(true);
    },
  );

  it.skipIf(!hasPython).each(frameworkNames)(
    '%s: Python, chunked one byte at a time, then retried whole as an sf-string, replays from Redis',
    async (framework) => {
      const key = `py-${randomUUID()}`;
      const body = Buffer.from('{"amount":1}');
      const auth: [string, string] = ['Authorization', `Bearer ${tokenFor('user-1')}`];
      const type: [string, string] = ['Content-Type', 'application/json'];
      const [first, again] = await python(servers.ports[framework], [
        {
          path: '/charges',
          headers: [auth, type, ['Idempotency-Key', key]],
          chunked: true,
          chunks: [...body].map((b) => Buffer.from([b])),
        },
        { path: '/charges', headers: [auth, type, ['Idempotency-Key', `"${key}"`]], chunks: [body] },
      ]);
      expect(first?.status).toBe(201);
      expect(again?.headers['idempotent-replayed']).toBe('true');
      expect(again?.body.equals(first?.body as Buffer)).toBe(true);
    },
  );

  it.skipIf(!hasCurl)(
    'Redis unreachable: 503 + Retry-After problem+json, byte-identical on the three, no run',
    async () => {
      const seen = [];
      for (const framework of frameworkNames) {
        const answer = await curl([
          ...post(randomUUID(), '--http1.0', '-d', 'x=1'),
          `http://127.0.0.1:${down.ports[framework]}/charges`,
        ]);
        expect(answer.status, framework).toBe(503);
        expect(answer.headers['retry-after'], framework).toMatch(/^\d+$/);
        seen.push({
          type: answer.headers['content-type'],
          cache: answer.headers['cache-control'],
          body: answer.body.toString(),
        });
      }
      expect(seen[0]?.type).toBe('application/problem+json');
      expect(JSON.parse(seen[0]?.body ?? '{}')).toMatchObject({
        status: 503,
        code: 'store_unavailable',
        retryable: true,
      });
      expect(seen[1]).toEqual(seen[0]);
      expect(seen[2]).toEqual(seen[0]);
      expect(down.runs()).toBe(0);
    },
  );
});
