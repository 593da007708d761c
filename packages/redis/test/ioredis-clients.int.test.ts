import { randomUUID } from 'node:crypto';
import type { StoredResponse } from '@idem/core';
import { createTcpProxy, describeStore } from '@idem/testkit';
import { Cluster, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RedisClientLike, type RedisStore, type RedisStoreOptions, redisStore } from '../src/index.js';
import { renewScript } from '../src/scripts.js';
import { startRedisCluster } from './cluster.js';
import { startedOnFirstUse } from './on-first-use.js';
import { deleteKeys, redisAvailable, redisBinariesAvailable, redisUrl } from './redis-env.js';
import { startReplicatedRedis } from './replicated.js';
import { redisStoreHarness } from './store-harness.js';

// redisStore over an array of ioredis clients, against real Redis: the whole store contract, with
// and without waitForReplicas, a claim race spread over every client, and scripts the server has
// not cached. replica-wait.int.test.ts has what the array is for: writes held by WAIT one each.

const withRedis = await redisAvailable();
const withBinaries = await redisBinariesAvailable();

// One prefix per file and run on the shared Redis, so parallel files and earlier runs never meet.
const prefix = `audit-iopool:${randomUUID()}:`;

const response = (body: Uint8Array): StoredResponse => ({ status: 201, headers: {}, body });

const connect = (url: string, count: number) => Array.from({ length: count }, () => new Redis(url));

// The store contract's harness, over the array: what it reads and expires behind the store's back
// goes through the same array, as an operator's tooling given the store's client would.
const harness = (
  clients: readonly (Redis | Cluster)[],
  store: RedisStore,
  options: Pick<RedisStoreOptions, 'waitForReplicas'> = {},
) =>
  redisStoreHarness(
    clients as RedisClientLike,
    store,
    () => Promise.all(clients.map((client) => client.quit())),
    options,
  );

// Counts what each client is asked to send: ioredis sends every command, in a pipeline or not,
// through its sendCommand.
const counted = (clients: readonly Redis[]) => {
  const counts = clients.map(() => 0);
  clients.forEach((client, index) => {
    const send = client.sendCommand.bind(client);
    client.sendCommand = (...args: Parameters<Redis['sendCommand']>) => {
      counts[index] = (counts[index] as number) + 1;
      return send(...args);
    };
  });
  return counts;
};

describe.runIf(withRedis)('redisStore over an array of ioredis clients, on a single Redis', () => {
  const admin = new Redis(redisUrl);
  afterAll(async () => {
    await deleteKeys(admin, prefix);
    await admin.quit();
  });

  describeStore(
    'redisStore over 4 ioredis clients',
    async () => {
      const clients = connect(redisUrl, 4);
      return harness(clients, redisStore({ client: clients, prefix: `${prefix}array:` }));
    },
    { concurrency: 100 },
  );

  it('gives exactly one of 100 concurrent claims of one key, sent over every client of 8', async () => {
    const clients = connect(redisUrl, 8);
    try {
      const counts = counted(clients);
      const store = redisStore({ client: clients, prefix: `${prefix}race:` });
      const id = randomUUID();
      const results = await Promise.all(
        Array.from({ length: 100 }, (_, i) => store.claim({ id, token: `t${i}`, fingerprint: 'fp', leaseMs: 60_000 })),
      );
      const winners = results.flatMap((result, i) => (result.claimed ? [i] : []));
      expect(winners).toHaveLength(1);
      for (const result of results) {
        if (!result.claimed) expect(result.record).toMatchObject({ state: 'in_progress', token: `t${winners[0]}` });
      }
      // Spread: every client carried some of the claims, none all of them.
      for (const count of counts) {
        expect(count).toBeGreaterThan(0);
        expect(count).toBeLessThan(100);
      }
    } finally {
      for (const client of clients) client.disconnect();
    }
  });
  // A client whose connection went silent (a partition: nothing answers, nothing is closed) keeps
  // what the store sent it in its count: after its one stuck command, every request goes elsewhere.
  it('Held: a client whose connection went silent gets no more commands while the others are idle', async () => {
    const { hostname, port } = new URL(redisUrl);
    const proxy = await createTcpProxy({ target: { host: hostname, port: Number(port || 6379) } });
    // Its stuck command fails after 5 s: a command the store wrongly sent it would fail the test then.
    const silent = new Redis({ host: proxy.host, port: proxy.port, commandTimeout: 5_000 });
    silent.on('error', () => undefined);
    const clients = [silent, ...connect(redisUrl, 3)];
    try {
      const store = redisStore({ client: clients, prefix: `${prefix}silent:` });
      const id = randomUUID();
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 });
      await store.complete({ id, token: 't', response: response(new Uint8Array([1])), retentionMs: 60_000 });
      const counts = counted(clients);
      proxy.blackhole();
      // Four at once, one to each client (none busy, so in turn): three answered, the silent one's not.
      const first = clients.map(() => store.get(id));
      let settled = 0;
      await new Promise<void>((resolve) => {
        for (const get of first) {
          get.then(
            () => ++settled === 3 && resolve(),
            () => undefined,
          );
        }
      });
      expect(counts).toEqual([1, 1, 1, 1]);
      // Each of these is answered before the next is sent: none goes to the silent client.
      for (let i = 0; i < 12; i++) expect((await store.get(id))?.state).toBe('completed');
      expect(counts).toEqual([1, 5, 5, 5]);
    } finally {
      for (const client of clients) client.disconnect();
      await proxy.close();
    }
  });
});

// waitForReplicas over the array, against a primary and replica of this file's own, on free ports.
describe.runIf(withBinaries)('redisStore over an array of ioredis clients, waitForReplicas on', () => {
  const waitForReplicas = { count: 1, timeout: '2s' } as const;
  const local = startedOnFirstUse(() => startReplicatedRedis());

  describeStore(
    'redisStore over 4 ioredis clients, waitForReplicas count 1',
    async () => {
      const clients = connect((await local()).primary.url, 4);
      const store = redisStore({ client: clients, prefix: 'audit-iopool:waited:', waitForReplicas });
      return harness(clients, store, { waitForReplicas });
    },
    { concurrency: 100 },
  );

  describe('scripts the server has not cached (a restart, SCRIPT FLUSH, a failover)', () => {
    let admin: Redis;
    beforeAll(async () => {
      admin = new Redis((await local()).primary.url);
    });
    afterAll(() => admin?.disconnect());

    // The store sends EVALSHA, and EVAL on NOSCRIPT, each to whichever client is least busy: right
    // because Redis caches a script per server, not per connection, so one client's EVAL caches it
    // for all the others. Were it per connection, the EVALSHA below would be a NOSCRIPT.
    it('Held: a script cached through one connection is there for every other connection of the server', async () => {
      const [a, b] = connect((await local()).primary.url, 2) as [Redis, Redis];
      try {
        await admin.script('FLUSH');
        const key = 'audit-iopool:cached';
        await a.eval(renewScript.source, 1, key, 'x', '1000');
        expect(await b.evalsha(renewScript.sha, 1, key, 'x', '1000')).toBe(0);
      } finally {
        a.disconnect();
        b.disconnect();
      }
    });

    it('Held: after SCRIPT FLUSH every write over 8 clients is answered, each client past its NOSCRIPT, and the replica has it', async () => {
      const clients = connect((await local()).primary.url, 8);
      try {
        const store = redisStore({ client: clients, prefix: 'audit-iopool:noscript:', waitForReplicas });
        const ids = Array.from({ length: 16 }, () => randomUUID());
        const claimed = await Promise.all(
          ids.map((id) => store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 })),
        );
        expect(claimed.every((result) => result.claimed)).toBe(true);
        await admin.script('FLUSH');
        const renewed = await Promise.all(ids.map((id) => store.renew({ id, token: 't', leaseMs: 60_000 })));
        expect(renewed).toEqual(ids.map(() => true));
        await admin.script('FLUSH');
        const completed = await Promise.all(
          ids.map((id) =>
            store.complete({ id, token: 't', response: response(new Uint8Array([9])), retentionMs: 60_000 }),
          ),
        );
        expect(completed).toEqual(ids.map(() => true));
        const replicaAdmin = new Redis((await local()).replica.url);
        try {
          for (const id of ids) expect((await replicaAdmin.getBuffer(store.key(id)))?.[0]).toBe('c'.charCodeAt(0));
        } finally {
          replicaAdmin.disconnect();
        }
        await admin.del(...ids.map((id) => store.key(id)));
      } finally {
        for (const client of clients) client.disconnect();
      }
    });
  });
});

// An array of ioredis Clusters: each routes a command to the master that owns its key, so the
// clients agree on where every record lives, whichever of them sends it.
describe.runIf(withBinaries)('redisStore over an array of ioredis Clusters, on a 3-master Redis Cluster', () => {
  const local = startedOnFirstUse(() => startRedisCluster());

  describeStore('redisStore over 3 ioredis Clusters', async () => {
    const { nodes } = await local();
    const clients = Array.from({ length: 3 }, () => new Cluster([...nodes]));
    return harness(clients, redisStore({ client: clients, prefix: 'audit-iopool:cluster:' }));
  });
});
