import { randomUUID } from 'node:crypto';
import { type StoredResponse, StoreUnavailableError } from '@idem/core';
import { createTcpProxy } from '@idem/testkit';
import { Cluster, Redis } from 'ioredis';
import { createClient, createClientPool, createCluster } from 'redis';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { type RedisClientLike, redisStore } from '../src/index.js';
import { type LocalRedisCluster, startRedisCluster } from './cluster.js';
import { redisBinariesAvailable } from './redis-env.js';
import type { RedisServerProcess } from './redis-server.js';
import { type ReplicatedRedis, startReplicatedRedis } from './replicated.js';

const withBinaries = await redisBinariesAvailable();

const response = (body: Uint8Array): StoredResponse => ({ status: 201, headers: {}, body });

// waitForReplicas against a real primary and replica this file starts, in the combinations the
// option's own suite does not reach: ioredis keyPrefix and auto-pipelining, a connection lost between
// a write and its WAIT, a replica that stops answering, a count no replica set can meet.
describe.runIf(withBinaries)('waitForReplicas against a real replica', () => {
  let started: ReplicatedRedis | undefined;
  let primary: RedisServerProcess;
  let replica: RedisServerProcess;
  let admin: Redis;
  let replicaAdmin: Redis;

  beforeAll(async () => {
    started = await startReplicatedRedis();
    ({ primary, replica } = started);
    admin = new Redis(primary.url);
    replicaAdmin = new Redis(replica.url);
  });
  afterAll(async () => {
    admin?.disconnect();
    replicaAdmin?.disconnect();
    await started?.stop({ hard: true });
  });

  // A replica that stops answering (SIGSTOP): still connected, so the primary keeps it in its count of
  // replicas, but it acknowledges nothing new. Continued, and caught up, before the test goes on.
  const withReplicaStopped = async <T>(work: () => Promise<T>): Promise<T> => {
    replica.child.kill('SIGSTOP');
    try {
      return await work();
    } finally {
      replica.child.kill('SIGCONT');
      await admin.set('audit-redisreplicas:caught-up', '1');
      while ((await admin.wait(1, 100)) < 1) await new Promise((resolve) => setTimeout(resolve, 20));
    }
  };

  // Polls the primary until `check` holds: readiness, never a sleep standing in for a deadline.
  const until = async (check: () => Promise<boolean>) => {
    const deadline = Date.now() + 10_000;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error('condition not reached');
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  };

  // The client id of the connection blocked in WAIT on the primary, once there is one.
  const blockedInWait = async (): Promise<string> => {
    let id: string | undefined;
    await until(async () => {
      const list = (await admin.client('LIST')) as string;
      id = /(?:^|\n)id=(\d+) [^\n]*cmd=wait/.exec(list)?.[1];
      return id !== undefined;
    });
    return id as string;
  };

  describe('a connection lost between a write and its WAIT', () => {
    // ioredis sends commands whose replies were lost again after it reconnects. Were the WAIT alone
    // sent again, on the new connection it would count replicas of a connection that wrote nothing,
    // answer at once, and make the unreplicated claim look acknowledged. ioredis (since 4.17, every
    // version the store accepts) rejects what is left of a pipeline that was half answered instead.
    it.each([
      ['ioredis', () => new Redis(primary.url)],
      [
        'node-redis',
        () =>
          createClient({ url: primary.url })
            .on('error', () => undefined)
            .connect(),
      ],
    ] as const)(
      'Held: %s: the WAIT is not answered on the new connection, the claim is a 503 and freed',
      async (_, connect) => {
        const client = (await connect()) as RedisClientLike & { disconnect?: () => void; destroy?: () => void };
        try {
          const store = redisStore({
            client,
            prefix: 'audit-redisreplicas:lone:',
            waitForReplicas: { count: 1, timeout: '5s' },
          });
          const id = randomUUID();
          await withReplicaStopped(async () => {
            const started = Date.now();
            const claim = store
              .claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 })
              .catch((caught: unknown) => caught);
            await admin.client('KILL', 'ID', await blockedInWait());
            const error = await claim;
            expect(error).toBeInstanceOf(StoreUnavailableError);
            expect(Date.now() - started).toBeLessThan(4_000);
            // Freed by its token (on the new connection), so the retry claims rather than meets a 409.
            await until(async () => (await admin.exists(store.key(id))) === 0);
          });
        } finally {
          if (typeof client.destroy === 'function') client.destroy();
          else client.disconnect?.();
        }
      },
    );

    // The other way a reply is lost: every reply of the pipeline, so ioredis sends all of it again
    // on the new connection. There the write finds its own work done (SET NX finds the key, complete
    // finds its outcome) and writes nothing, so that connection's WAIT counts from no write at all
    // and answers at once with every replica still connected, one that has nothing of it included.
    describe('every reply of the pipeline lost, the whole pipeline sent again', () => {
      const lostReplies = async (
        operation: (store: ReturnType<typeof redisStore>, id: string) => Promise<unknown>,
        prepare?: (store: ReturnType<typeof redisStore>, id: string) => Promise<unknown>,
        written?: (value: Buffer | null) => boolean,
      ) => {
        const proxy = await createTcpProxy({ target: { host: '127.0.0.1', port: primary.port } });
        const client = new Redis({ host: proxy.host, port: proxy.port, retryStrategy: () => 20 });
        client.on('error', () => undefined);
        try {
          const store = redisStore({
            client,
            prefix: 'audit-redisreplicas:resent:',
            waitForReplicas: { count: 1, timeout: '1s' },
          });
          // Connected, and the scripts cached on the primary (a NOSCRIPT whose reply is lost would
          // stop the pipeline before its write ran), before the replies are cut off.
          const warm = randomUUID();
          await store.claim({ id: warm, token: 't', fingerprint: '', leaseMs: 60_000 });
          await store.complete({ id: warm, token: 't', response: response(new Uint8Array([1])), retentionMs: 1_000 });
          const id = randomUUID();
          await prepare?.(store, id);
          return await withReplicaStopped(async () => {
            proxy.blackhole('downstream');
            const outcome = operation(store, id).then(
              (value) => ({ value }),
              (error: unknown) => ({ error }),
            );
            // The write ran on the primary, and its WAIT waits for the stopped replica; no reply
            // reached the client. Then the connection drops.
            await until(async () => (written ?? ((value) => value !== null))(await admin.getBuffer(store.key(id))));
            await blockedInWait();
            proxy.cut();
            proxy.restore();
            const settled = await outcome;
            return { settled, key: store.key(id) };
          });
        } finally {
          client.disconnect();
          await proxy.close();
        }
      };

      it('a claim is not answered as claimed while its replica has nothing of it', async () => {
        const { settled, key } = await lostReplies((store, id) =>
          store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 }),
        );
        expect(settled).toEqual({ error: expect.any(StoreUnavailableError) });
        expect(await admin.exists(key)).toBe(0);
      });

      // Held on the suite's Redis 7.0, which counts for WAIT up to the last command of the connection,
      // read or write: the resent WAIT covers the first run's write. WAIT's documented contract is
      // only "the previous write commands sent in the context of the current connection", so the
      // completion found done writes something again (next test) to hold on any server.
      it('Held: a completion is not answered as stored while its replica has nothing of it', async () => {
        const { settled } = await lostReplies(
          (store, id) =>
            store.complete({ id, token: 't', response: response(new Uint8Array([9])), retentionMs: 60_000 }),
          (store, id) => store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 }),
          (value) => value?.[0] === 'c'.charCodeAt(0),
        );
        expect(settled).toEqual({ error: expect.any(StoreUnavailableError) });
      });
    });
  });

  // What the resent WAIT can count on: a write of its own connection, after the first run's. A
  // completion that finds its outcome stored (sent again after a reconnect) answers 1; wrote it
  // nothing, a WAIT behind it would, by its contract, count from no write of that connection.
  it('a completion sent again writes to the replication stream, so the WAIT behind it covers the first run', async () => {
    const client = new Redis(primary.url);
    try {
      const store = redisStore({ client, prefix: 'audit-redisreplicas:twice:' });
      const id = randomUUID();
      const completion = { id, token: 't', response: response(new Uint8Array([5])), retentionMs: 60_000 };
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 });
      expect(await store.complete(completion)).toBe(true);
      const offset = async () => Number(/master_repl_offset:(\d+)/.exec(await admin.info('replication'))?.[1]);
      const before = await offset();
      const ttlBefore = await admin.pttl(store.key(id));
      expect(await store.complete(completion)).toBe(true);
      expect(await offset()).toBeGreaterThan(before);
      // Without changing what is kept, or for how long.
      expect((await admin.getBuffer(store.key(id)))?.[0]).toBe('c'.charCodeAt(0));
      expect(await admin.pttl(store.key(id))).toBeLessThanOrEqual(ttlBefore);
    } finally {
      client.disconnect();
    }
  });

  describe('ioredis enableAutoPipelining', () => {
    // Auto-pipelining batches the commands of one tick, from every caller, into one write on the
    // client's one connection. Other commands may land between a write and its WAIT: WAIT then counts
    // up to the later of them, which includes the write, so it can only wait longer, never prove less.
    it("Held: every write and its WAIT leave together, among other callers' commands, and a WAIT short of replicas is still a 503", async () => {
      const client = new Redis(primary.url, { enableAutoPipelining: true });
      try {
        const store = redisStore({
          client,
          prefix: 'audit-redisreplicas:auto:',
          waitForReplicas: { count: 1, timeout: '2s' },
        });
        const ids = Array.from({ length: 20 }, () => randomUUID());
        const others = Array.from({ length: 20 }, (_, i) => client.set(`audit-redisreplicas:auto-other:${i}`, 'x'));
        const claims = await Promise.all(
          ids.map((id) => store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 })),
        );
        await Promise.all(others);
        expect(claims).toEqual(ids.map(() => ({ claimed: true })));
        // Each claim's WAIT left in the same pipeline as its SET, on the one connection.
        for (const id of ids) expect((await replicaAdmin.getBuffer(store.key(id)))?.[0]).toBe('p'.charCodeAt(0));
        await withReplicaStopped(async () => {
          const short = redisStore({
            client,
            prefix: 'audit-redisreplicas:auto:',
            waitForReplicas: { count: 1, timeout: 100 },
          });
          const id = randomUUID();
          const [error] = await Promise.all([
            short.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 }).catch((caught: unknown) => caught),
            client.get('audit-redisreplicas:auto-other:0'),
          ]);
          expect(error).toBeInstanceOf(StoreUnavailableError);
          expect(await admin.exists(store.key(id))).toBe(0);
        });
        await admin.del(
          ...ids.map((id) => store.key(id)),
          ...Array.from({ length: 20 }, (_, i) => `audit-redisreplicas:auto-other:${i}`),
        );
      } finally {
        client.disconnect();
      }
    });
  });

  describe('a replica that stops answering', () => {
    it('Held: a count above the replicas there are is a 503 after the timeout, the claim freed, the retry claimed once they are', async () => {
      const client = new Redis(primary.url);
      try {
        const id = randomUUID();
        const two = redisStore({
          client,
          prefix: 'audit-redisreplicas:count:',
          waitForReplicas: { count: 2, timeout: 150 },
        });
        const started = Date.now();
        const error = await two
          .claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 })
          .catch((caught: unknown) => caught);
        expect(Date.now() - started).toBeGreaterThanOrEqual(140);
        expect((error as Error).message).toMatch(/1 of 2 replicas acknowledged it within 150 ms/);
        expect(await admin.exists(two.key(id))).toBe(0);
        const one = redisStore({
          client,
          prefix: 'audit-redisreplicas:count:',
          waitForReplicas: { count: 1, timeout: 150 },
        });
        expect(await one.claim({ id, token: 'u', fingerprint: '', leaseMs: 60_000 })).toEqual({ claimed: true });
        await admin.del(one.key(id));
      } finally {
        client.disconnect();
      }
    });

    it('Held: a stopped replica makes a write a 503 within about the timeout, the key not held, the outcome retryable', async () => {
      const client = new Redis(primary.url);
      try {
        const store = redisStore({
          client,
          prefix: 'audit-redisreplicas:stopped:',
          waitForReplicas: { count: 1, timeout: 200 },
        });
        const id = randomUUID();
        expect(await store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 })).toEqual({ claimed: true });
        const completion = { id, token: 't', response: response(new Uint8Array([3])), retentionMs: 60_000 };
        const fresh = randomUUID();
        await withReplicaStopped(async () => {
          let started = Date.now();
          const claimError = await store
            .claim({ id: fresh, token: 't', fingerprint: '', leaseMs: 60_000 })
            .catch((caught: unknown) => caught);
          expect(claimError).toBeInstanceOf(StoreUnavailableError);
          expect(Date.now() - started).toBeLessThan(1_000);
          expect(await admin.exists(store.key(fresh))).toBe(0);
          started = Date.now();
          const completeError = await store.complete(completion).catch((caught: unknown) => caught);
          expect(completeError).toBeInstanceOf(StoreUnavailableError);
          expect(Date.now() - started).toBeLessThan(1_000);
        });
        // The completion ran on the primary; sent again once the replica is back (the engine's retry
        // of a 503'd completion, or the client's), it is answered stored, and this time proved.
        expect(await store.complete(completion)).toBe(true);
        expect((await replicaAdmin.getBuffer(store.key(id)))?.[0]).toBe('c'.charCodeAt(0));
        expect(await store.claim({ id: fresh, token: 'u', fingerprint: '', leaseMs: 60_000 })).toEqual({
          claimed: true,
        });
        await admin.del(store.key(id), store.key(fresh));
      } finally {
        client.disconnect();
      }
    });

    // While a replica is away, `count` writes' worth of requests all wait on one another: how long
    // the slowest of 8 concurrent claims and a replay queued with them take, on `client`.
    const queued = async (client: RedisClientLike, prefix: string) => {
      const store = redisStore({ client, prefix, waitForReplicas: { count: 1, timeout: 200 } });
      const done = randomUUID();
      await store.claim({ id: done, token: 't', fingerprint: '', leaseMs: 60_000 });
      await store.complete({ id: done, token: 't', response: response(new Uint8Array([1])), retentionMs: 60_000 });
      return withReplicaStopped(async () => {
        const started = Date.now();
        const timed = async (work: Promise<unknown>) => {
          await work.catch(() => undefined);
          return Date.now() - started;
        };
        const writes = Array.from({ length: 8 }, () =>
          timed(store.claim({ id: randomUUID(), token: 't', fingerprint: '', leaseMs: 60_000 })),
        );
        const replay = timed(store.get(done));
        return { slowestWrite: Math.max(...(await Promise.all(writes))), replay: await replay };
      });
    };

    // Was wrong: WAIT blocks the connection it is sent on, and one ioredis client is one connection.
    // While a replica is away, the writes of concurrent requests waited one timeout after the other,
    // and each claim's release (its 503's clean-up) queued behind every later WAIT: 8 concurrent
    // claims with `timeout: 200` all answered after about 1.8 s, and a replay (a plain GET) sent with
    // them as late. Decided: the store takes an array of ioredis clients and sends each command to
    // the one with the fewest of its commands in flight, so each write waits its own timeout.
    it('concurrent writes on an array of 8 ioredis clients each answer within about the timeout, and a replay is not held behind them', async () => {
      const clients = Array.from({ length: 8 }, () => new Redis(primary.url));
      try {
        const { slowestWrite, replay } = await queued(clients, 'audit-iopool:queue-io-array:');
        expect(slowestWrite).toBeLessThan(1_000);
        expect(replay).toBeLessThan(1_000);
      } finally {
        for (const client of clients) client.disconnect();
      }
    });

    // What docs/stores.md (Throughput) says of one ioredis client, kept as the reason for the array:
    // its 8 writes wait one timeout after another, and the replay waits behind them.
    it('Held: on one ioredis client (one connection), concurrent writes wait one timeout after another, and a replay behind them', async () => {
      const client = new Redis(primary.url);
      try {
        const { slowestWrite, replay } = await queued(client, 'audit-iopool:queue-io:');
        // 8 timeouts of 200 ms are 1.6 s; 1.2 s leaves room for how Redis times a WAIT out, and is
        // still far past what the array answers in (one timeout).
        expect(slowestWrite).toBeGreaterThan(1_200);
        expect(replay).toBeGreaterThan(1_200);
      } finally {
        client.disconnect();
      }
    });

    it('Held: on a node-redis pool, concurrent writes each answer within about the timeout, and a replay is not held', async () => {
      const pool = createClientPool({ url: primary.url }, { minimum: 1, maximum: 10 });
      pool.on('error', () => undefined);
      await pool.connect();
      try {
        const { slowestWrite, replay } = await queued(pool, 'audit-redisreplicas:queue-pool:');
        expect(slowestWrite).toBeLessThan(1_000);
        expect(replay).toBeLessThan(1_000);
      } finally {
        pool.destroy();
      }
    });
  });

  describe('ioredis keyPrefix', () => {
    it('Held: the scripts and SET get the client prefix once, WAIT (keyless) passes, and a short claim is freed under the prefixed key', async () => {
      const client = new Redis(primary.url, { keyPrefix: 'audit-redisreplicas:kp:' });
      try {
        const store = redisStore({ client, prefix: 'idem:', waitForReplicas: { count: 1, timeout: '2s' } });
        const id = randomUUID();
        const full = `audit-redisreplicas:kp:${store.key(id)}`;
        expect(await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
        expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
        expect(
          await store.complete({ id, token: 't', response: response(new Uint8Array([7])), retentionMs: 60_000 }),
        ).toBe(true);
        expect((await store.get(id))?.state).toBe('completed');
        // Once: the key is the client's prefix, then the store's, then the id; nothing doubled, nothing bare.
        expect(await admin.exists(full)).toBe(1);
        expect(await admin.exists(store.key(id))).toBe(0);
        expect(await admin.exists(`audit-redisreplicas:kp:${full}`)).toBe(0);
        // And the replica has it, under the same name, by the time the store answered.
        expect((await replicaAdmin.getBuffer(full))?.[0]).toBe('c'.charCodeAt(0));

        const short = randomUUID();
        await withReplicaStopped(async () => {
          const waiting = redisStore({ client, prefix: 'idem:', waitForReplicas: { count: 1, timeout: 100 } });
          const error = await waiting
            .claim({ id: short, token: 't', fingerprint: '', leaseMs: 60_000 })
            .catch((caught: unknown) => caught);
          expect(error).toBeInstanceOf(StoreUnavailableError);
          // Freed by its token under the prefixed key (the release goes through the same client).
          expect(await admin.exists(`audit-redisreplicas:kp:${store.key(short)}`)).toBe(0);
        });
        await store.forget({ id, token: 't' });
      } finally {
        client.disconnect();
      }
    });
  });
});

// The suite's other cluster has no replicas, so there WAIT can only answer 0: what it checks is the
// routing. Here each master has a replica, so WAIT has something to count, per shard.
describe.runIf(withBinaries)('waitForReplicas on a Redis Cluster of 3 masters with a replica each', () => {
  let cluster: LocalRedisCluster | undefined;
  beforeAll(async () => {
    cluster = await startRedisCluster({ replicas: 1 });
  }, 60_000);
  afterAll(async () => {
    await cluster?.stop();
  });
  // Each case from the cluster as it started: the ioredis case stops a replica for seconds (past
  // cluster-node-timeout on a loaded box), and the node-redis case after it counts on the three
  // masters it started with (once in CI it saw its records on 2 of them).
  beforeEach(async () => {
    await cluster?.healthy();
  }, 60_000);

  it.each([
    ['ioredis Cluster', async (nodes: LocalRedisCluster) => new Cluster([...nodes.nodes])],
    [
      'node-redis cluster',
      async (nodes: LocalRedisCluster) =>
        createCluster({ rootNodes: nodes.urls.map((url) => ({ url })) })
          .on('error', () => undefined)
          .connect(),
    ],
  ] as const)(
    "Held: %s: a write is stored once its shard's replica has it, and a 503 on the one shard whose replica stopped",
    async (_, connect) => {
      const local = cluster as LocalRedisCluster;
      const client = (await connect(local)) as RedisClientLike & {
        quit?: () => Promise<unknown>;
        close?: () => Promise<unknown>;
      };
      const masters = local.nodes.map((node) => new Redis(node.port, node.host));
      try {
        const store = redisStore({
          client,
          prefix: 'audit-redisreplicas:cluster:',
          waitForReplicas: { count: 1, timeout: 300 },
        });
        // Enough records that every master owns some (24 missed one master once in CI).
        const ids = Array.from({ length: 48 }, () => randomUUID());
        for (const id of ids) {
          expect(await store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 })).toEqual({ claimed: true });
          expect(
            await store.complete({ id, token: 't', response: response(new Uint8Array([2])), retentionMs: 60_000 }),
          ).toBe(true);
        }
        // Which master holds which record, and the replica of the first one.
        const owner = async (id: string) => {
          // A master that does not own the key's slot answers MOVED: not there. Any other error
          // (CLUSTERDOWN, a lost connection) fails the case as itself, not as a record missing.
          const found = await Promise.all(
            masters.map((master) =>
              master.exists(store.key(id)).catch((error: unknown) => {
                if (error instanceof Error && error.message.startsWith('MOVED ')) return 0;
                throw error;
              }),
            ),
          );
          return found.indexOf(1);
        };
        const owners = await Promise.all(ids.map(owner));
        // Each record on one master (-1: on none of them, e.g. a master that failed over), every master some.
        expect(new Set(owners), `owners ${owners.join(',')}`).toEqual(new Set([0, 1, 2]));
        const firstMasterId = await masters[0]!.cluster('MYID');
        const replicas = local.servers.filter((server) => !local.nodes.some((node) => node.port === server.port));
        const roles = await Promise.all(
          replicas.map(async (server) => {
            const one = new Redis(server.port, '127.0.0.1');
            try {
              return ((await one.cluster('NODES')) as string).split('\n').find((line) => line.includes('myself'));
            } finally {
              one.disconnect();
            }
          }),
        );
        const stopped = replicas[roles.findIndex((line) => line?.includes(String(firstMasterId)))];
        expect(stopped).toBeDefined();
        stopped!.child.kill('SIGSTOP');
        try {
          const results = await Promise.all(
            Array.from({ length: 24 }, async () => {
              const id = randomUUID();
              const outcome = await store.claim({ id, token: 't', fingerprint: '', leaseMs: 60_000 }).then(
                () => 'claimed',
                (error: unknown) => (error instanceof StoreUnavailableError ? '503' : String(error)),
              );
              return { outcome, id };
            }),
          );
          for (const { outcome, id } of results) {
            // A short claim is freed, so its key is on no master; a stored one is on its shard's master.
            const where = await owner(id);
            if (outcome === '503') expect(where).toBe(-1);
            else expect(outcome).toBe('claimed');
          }
          // The shard whose replica stopped answered 503, the others stored.
          const claimedOwners = new Set(
            await Promise.all(results.filter((r) => r.outcome === 'claimed').map((r) => owner(r.id))),
          );
          expect(claimedOwners.has(0)).toBe(false);
          expect(results.some((r) => r.outcome === '503')).toBe(true);
          expect(claimedOwners.size).toBe(2);
        } finally {
          stopped!.child.kill('SIGCONT');
        }
      } finally {
        for (const master of masters) master.disconnect();
        if (typeof client.close === 'function') await client.close();
        else await client.quit?.();
      }
    },
  );
});
