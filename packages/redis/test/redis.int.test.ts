import { randomUUID } from 'node:crypto';
import {
  createIdempotency,
  type IdempotencyEvent,
  InvalidResponseError,
  recordId,
  type Store,
  StoreContendedError,
  type StoredResponse,
  StoreUnavailableError,
} from '@idem/core';
import { createTcpProxy, describeStore } from '@idem/testkit';
import { Cluster, Redis } from 'ioredis';
import { createClient, createClientPool, createCluster, RESP_TYPES } from 'redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  RecordFormatError,
  type RedisClientLike,
  type RedisCommandRunner,
  type RedisStore,
  redisCommandRunner,
  redisStore,
  UnexpectedReplyError,
} from '../src/index.js';
import { encodeOutcome } from '../src/record-codec.js';
import { inspectScript } from '../src/scripts.js';
import { startRedisCluster } from './cluster.js';
import { startedOnFirstUse } from './on-first-use.js';
import { deleteKeys, freePort, redisAvailable, redisBinariesAvailable, redisUrl } from './redis-env.js';
import { type RedisServerProcess, startRedisServer } from './redis-server.js';
import { startReplicatedRedis } from './replicated.js';
import { redisStoreHarness } from './store-harness.js';

const withRedis = await redisAvailable();
const withBinaries = await redisBinariesAvailable();

// One prefix per file and run, so parallel files and earlier runs never meet.
const prefix = `idem-test:redis-int:${randomUUID()}:`;

const harness = redisStoreHarness;

const response = (body: Uint8Array, status = 201): StoredResponse => ({
  status,
  headers: { 'content-type': 'application/json' },
  body,
});

describe.runIf(withRedis)('@idem/redis on a single Redis', () => {
  const admin = new Redis(redisUrl);
  afterAll(async () => {
    await deleteKeys(admin, prefix);
    await admin.quit();
  });

  describeStore('redisStore with ioredis', async () => {
    const client = new Redis(redisUrl);
    return harness(client, redisStore({ client, prefix: `${prefix}io:` }), () => client.quit());
  });

  describeStore('redisStore with node-redis', async () => {
    const client = createClient({ url: redisUrl });
    await client.connect();
    return harness(client, redisStore({ client, prefix: `${prefix}nr:` }), () => client.close());
  });

  // ioredis with `stringNumbers: true` answers every integer reply as a string, the scripts' 1 and 0
  // included: the whole contract again on such a client.
  describeStore('redisStore with ioredis, stringNumbers: true', async () => {
    const client = new Redis(redisUrl, { stringNumbers: true });
    return harness(client, redisStore({ client, prefix: `${prefix}io-strnum:` }), () => client.quit());
  });

  describe('integer replies in every form a client gives them', () => {
    // The real client, with the scripts' integer replies handed back as another client would.
    const reshaped = (shape: (n: number) => unknown): RedisCommandRunner => {
      const real = redisCommandRunner(admin);
      return {
        send: async (key, args) => {
          const reply = await real.send(key, args);
          return typeof reply === 'number' ? shape(reply) : reply;
        },
      };
    };
    const forms: Array<[string, (n: number) => unknown]> = [
      ['a decimal string', (n) => String(n)],
      ['bytes', (n) => Buffer.from(String(n))],
      ['a bigint', (n) => BigInt(n)],
    ];

    it.each(forms)("reads the scripts' 1 and 0 given as %s", async (_, shape) => {
      const store = redisStore({ client: reshaped(shape), prefix: `${prefix}forms:` });
      const id = randomUUID();
      expect(await store.claim({ id, token: 't', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
      expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
      expect(await store.renew({ id, token: 'stale', leaseMs: 5_000 })).toBe(false);
      expect(await store.release({ id, token: 'stale' })).toBe(false);
      expect(
        await store.complete({ id, token: 't', response: response(new Uint8Array([1])), retentionMs: 60_000 }),
      ).toBe(true);
      expect(
        await store.complete({ id, token: 'u', response: response(new Uint8Array([1])), retentionMs: 60_000 }),
      ).toBe(false);
      const released = randomUUID();
      await store.claim({ id: released, token: 't', fingerprint: '', leaseMs: 5_000 });
      expect(await store.release({ id: released, token: 't' })).toBe(true);
      expect(await store.forget({ id, token: 'stale' })).toBe(false);
      expect(await store.forget({ id, token: 't' })).toBe(true);
    });

    it('still refuses a reply that is no integer, or another integer', async () => {
      // -1 too: the scripts answer 1 or 0 only, so a negative answer is no "refused" either.
      for (const odd of ['OK', '1.0', ' 1', 2, -1, '-1', Buffer.from('yes')]) {
        const store = redisStore({ client: reshaped(() => odd), prefix: `${prefix}forms:` });
        const id = randomUUID();
        await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
        const error = await store.renew({ id, token: 't', leaseMs: 5_000 }).catch((caught: unknown) => caught);
        // Redis answered, in a form this client setup hands over unreadable: not "unavailable".
        expect(error).toBeInstanceOf(UnexpectedReplyError);
        expect(error).not.toBeInstanceOf(StoreUnavailableError);
        // Said once, not wrapped again as a failure of Redis with itself as the cause.
        expect((error as Error).message).toBe('Redis renew returned an unexpected reply');
      }
    });

    it('through the engine on ioredis with stringNumbers: stored, no store-error, replayed', async () => {
      const client = new Redis(redisUrl, { stringNumbers: true });
      try {
        const events: IdempotencyEvent[] = [];
        const store = redisStore({ client, prefix: `${prefix}io-strnum-engine:` });
        const engine = createIdempotency({ store, heartbeat: false, onEvent: (event) => events.push(event) });
        const request = { key: randomUUID(), scope: 'user:1', operation: 'POST /charges' };
        const first = await engine.begin(request);
        expect(first.kind).toBe('execute');
        if (first.kind !== 'execute') return;
        expect(await store.renew({ id: first.lease.id, token: first.lease.token, leaseMs: 5_000 })).toBe(true);
        expect((await engine.complete(first.lease, response(new Uint8Array([7])))).ok).toBe(true);
        expect(events.filter((event) => event.type === 'store-error')).toEqual([]);
        expect((await engine.begin(request)).kind).toBe('replay');
      } finally {
        await client.quit();
      }
    });

    it("node-redis answers numbers whatever the client's own typeMapping says (RESP3, numbers as strings)", async () => {
      const client = createClient({
        url: redisUrl,
        RESP: 3,
        commandOptions: { typeMapping: { [RESP_TYPES.NUMBER]: String, [RESP_TYPES.SIMPLE_STRING]: Buffer } },
      });
      await client.connect();
      try {
        const store = redisStore({ client, prefix: `${prefix}nr-mapped:` });
        const id = randomUUID();
        expect(await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
        expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
        expect(
          await store.complete({ id, token: 't', response: response(new Uint8Array([1])), retentionMs: 60_000 }),
        ).toBe(true);
        expect((await store.get(id))?.state).toBe('completed');
      } finally {
        await client.close();
      }
    });
  });

  describe('key layout and clock', () => {
    const store = redisStore({ client: admin, prefix: `${prefix}layout:` });

    it('keeps one record per key, prefix + id, with the lease as the Redis TTL', async () => {
      const id = recordId('user:1', 'POST /charges', randomUUID());
      expect(store.key(id)).toBe(`${prefix}layout:${id}`);
      await store.claim({ id, token: 'tok', fingerprint: 'fp', leaseMs: 4_000 });
      expect(await admin.type(store.key(id))).toBe('string');
      const ttl = await admin.pttl(store.key(id));
      expect(ttl).toBeGreaterThan(2_000);
      expect(ttl).toBeLessThanOrEqual(4_000);
      expect(await admin.keys(`${prefix}layout:*`)).toEqual([store.key(id)]);
    });

    it('stores the body as raw bytes, not base64', async () => {
      const id = randomUUID();
      await store.claim({ id, token: 'tok', fingerprint: '', leaseMs: 4_000 });
      const body = new Uint8Array(10_000).fill(0xff);
      await store.complete({ id, token: 'tok', response: response(body), retentionMs: 60_000 });
      const raw = await admin.getBuffer(store.key(id));
      expect(raw?.subarray(raw.length - body.length).equals(Buffer.from(body))).toBe(true);
      expect(raw?.length).toBeLessThan(body.length + 200);
    });

    it('keeps a claim for its lease plus its keep, and completes it into the value an older version reads', async () => {
      const id = randomUUID();
      const plain = randomUUID();
      await store.claim({ id, token: 'tok', fingerprint: 'fp', leaseMs: 4_000, keepAfterLeaseMs: 60_000 });
      expect((await admin.getBuffer(store.key(id)))?.toString()).toBe('p"tok"\n"fp"\n60000\n');
      const ttl = await admin.pttl(store.key(id));
      expect(ttl).toBeGreaterThan(62_000);
      expect(ttl).toBeLessThanOrEqual(64_000);
      await store.claim({ id: plain, token: 'tok', fingerprint: 'fp', leaseMs: 4_000 });
      const outcome = response(new Uint8Array([7, 10, 8]));
      await store.complete({ id, token: 'tok', response: outcome, retentionMs: 60_000 });
      await store.complete({ id: plain, token: 'tok', response: outcome, retentionMs: 60_000 });
      expect((await admin.getBuffer(store.key(id)))?.equals((await admin.getBuffer(store.key(plain))) as Buffer)).toBe(
        true,
      );
      await expect(
        store.claim({ id: randomUUID(), token: 't', fingerprint: '', leaseMs: 1_000, keepAfterLeaseMs: -1 }),
      ).rejects.toThrow(TypeError);
    });

    it('rounds a fractional lease up and refuses a non-positive one', async () => {
      const id = randomUUID();
      expect(await store.claim({ id, token: 't', fingerprint: '', leaseMs: 1_500.2 })).toEqual({ claimed: true });
      expect(await admin.pttl(store.key(id))).toBeLessThanOrEqual(1_501);
      await expect(store.claim({ id: randomUUID(), token: 't', fingerprint: '', leaseMs: 0 })).rejects.toThrow(
        TypeError,
      );
      await expect(store.renew({ id, token: 't', leaseMs: Number.NaN })).rejects.toThrow(TypeError);
    });

    it('rounds a lease or retention under a millisecond up to one, never down to a PX 0 that Redis refuses', async () => {
      expect(await store.claim({ id: randomUUID(), token: 't', fingerprint: '', leaseMs: 0.4 })).toEqual({
        claimed: true,
      });
      const id = randomUUID();
      await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
      expect(await store.complete({ id, token: 't', response: response(new Uint8Array([1])), retentionMs: 0.4 })).toBe(
        true,
      );
    });
  });

  describe('round trips', () => {
    // Counts the commands a store sends through a real client.
    const counted = (client: RedisClientLike) => {
      const real = redisCommandRunner(client);
      const sent: string[] = [];
      const runner: RedisCommandRunner = {
        send: (key, args) => {
          sent.push(String(args[0]));
          return real.send(key, args);
        },
      };
      return { runner, sent };
    };

    it('claims a fresh key with one SET, and reads a taken one with one GET more, on ioredis and node-redis', async () => {
      const nodeRedis = createClient({ url: redisUrl });
      await nodeRedis.connect();
      try {
        for (const client of [admin, nodeRedis] as RedisClientLike[]) {
          const { runner, sent } = counted(client);
          const store = redisStore({ client: runner, prefix: `${prefix}trips:` });
          const id = randomUUID();
          // Each client spells SET's OK its own way (bytes, a string); misread, a fresh claim would
          // still win through the GET that finds its own token, at twice the round trips.
          expect(await store.claim({ id, token: 'a', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
          expect(sent).toEqual(['SET']);
          sent.length = 0;
          expect((await store.claim({ id, token: 'b', fingerprint: '', leaseMs: 5_000 })).claimed).toBe(false);
          expect(sent).toEqual(['SET', 'GET']);
          // A claim kept after its lease is read with its PTTL, in one script, to tell a live lease
          // from an abandoned one; a completed record still costs only the GET.
          const kept = randomUUID();
          await admin.script('LOAD', inspectScript.source); // else a first EVALSHA falls back to EVAL
          await store.claim({ id: kept, token: 'a', fingerprint: '', leaseMs: 5_000, keepAfterLeaseMs: 60_000 });
          sent.length = 0;
          expect(await store.claim({ id: kept, token: 'b', fingerprint: '', leaseMs: 5_000 })).toEqual({
            claimed: false,
            record: { state: 'in_progress', token: 'a', fingerprint: '' },
          });
          expect(sent).toEqual(['SET', 'GET', 'EVALSHA']);
          await store.complete({ id: kept, token: 'a', response: response(new Uint8Array([1])), retentionMs: 60_000 });
          sent.length = 0;
          expect((await store.claim({ id: kept, token: 'b', fingerprint: '', leaseMs: 5_000 })).claimed).toBe(false);
          expect(sent).toEqual(['SET', 'GET']);
        }
      } finally {
        await nodeRedis.close();
      }
    });
  });

  // waitForReplicas rests on this: WAIT counts the replicas that have the writes of the connection
  // it is sent on, so a write and its WAIT must leave on one connection, or the WAIT answers for a
  // connection that wrote nothing and the write is reported replicated when it is not.
  // Was wrong: a node-redis pool (createClientPool) has a sendCommand, so it was taken for a plain
  // client, and its pipeline was two sendCommand calls, which the pool hands to two of its clients.
  it('sends the commands of a pipeline on one connection, with every client it pipelines for', async () => {
    const nodeRedis = await createClient({ url: redisUrl }).connect();
    const pool = createClientPool({ url: redisUrl });
    await pool.connect();
    try {
      for (const client of [admin, nodeRedis, pool] as RedisClientLike[]) {
        const runner = redisCommandRunner(client);
        // Concurrent, as requests are: a pool then has every reason to spread them.
        const pipelines = await Promise.all(
          Array.from({ length: 10 }, () =>
            runner.sendPipeline?.('k', [
              ['CLIENT', 'ID'],
              ['CLIENT', 'ID'],
            ]),
          ),
        );
        for (const ids of pipelines) {
          expect(ids).toHaveLength(2);
          expect(ids?.[1]).toEqual(ids?.[0]);
        }
      }
    } finally {
      await nodeRedis.close();
      await pool.close();
    }
  });

  describe('claim races', () => {
    // A runner over the real client that lets a test act between the claim's SET NX and its GET.
    const interposed = (before: (command: string, key: string) => Promise<void>): RedisCommandRunner => {
      const real = redisCommandRunner(admin);
      return {
        send: async (key, args) => {
          await before(String(args[0]), key);
          return real.send(key, args);
        },
      };
    };

    it('claims a key that the holder released between the refused SET NX and the GET', async () => {
      const store = redisStore({
        client: interposed(async (command, key) => {
          if (command === 'GET') await admin.del(key);
        }),
        prefix: `${prefix}race:`,
      });
      const id = randomUUID();
      await admin.set(store.key(id), 'p"holder"\n""\n', 'PX', 60_000);
      expect(await store.claim({ id, token: 'mine', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
      expect(await admin.get(store.key(id))).toBe('p"mine"\n"fp"\n');
    });

    it('a claim whose reply was lost, sent again by ioredis after it reconnected, is still the claim of its caller', async () => {
      const { hostname, port } = new URL(redisUrl);
      const proxy = await createTcpProxy({ target: { host: hostname, port: Number(port || 6379) } });
      // ioredis resends the commands that got no reply once it has reconnected (its default).
      const client = new Redis(proxy.port, proxy.host, { retryStrategy: () => 10 });
      client.on('error', () => undefined);
      try {
        const store = redisStore({ client, prefix: `${prefix}resent:` });
        const id = randomUUID();
        await client.ping();
        // Redis runs the SET NX; its "OK" never arrives.
        proxy.blackhole('downstream');
        const claim = store.claim({ id, token: 'mine', fingerprint: 'fp', leaseMs: 5_000 });
        while ((await admin.exists(store.key(id))) === 0) await new Promise((resolve) => setTimeout(resolve, 5));
        // The connection drops and comes back: the resent SET NX finds the key taken, by this very claim.
        proxy.cut();
        proxy.restore();
        expect(await claim).toEqual({ claimed: true });
        expect(await store.renew({ id, token: 'mine', leaseMs: 5_000 })).toBe(true);
      } finally {
        client.disconnect();
        await proxy.close();
      }
    });

    it('reads nil given as undefined, as a runner of its own may give it', async () => {
      const real = redisCommandRunner(admin);
      let releaseBeforeGet = false;
      const store = redisStore({
        client: {
          send: async (key, args) => {
            if (releaseBeforeGet && args[0] === 'GET') await admin.del(key);
            return (await real.send(key, args)) ?? undefined;
          },
        },
        prefix: `${prefix}race:`,
      });
      const id = randomUUID();
      expect(await store.get(id)).toBeUndefined();
      // Released between the refused SET NX and the GET: an undefined GET is a free key, claimed again.
      await admin.set(store.key(id), 'p"holder"\n""\n', 'PX', 60_000);
      releaseBeforeGet = true;
      expect(await store.claim({ id, token: 'mine', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
      expect(await admin.get(store.key(id))).toBe('p"mine"\n"fp"\n');
    });

    it('answers a claim that finds its own token on a completed record with that record', async () => {
      // The own-token shortcut is for a SET NX sent twice, which can only find its claim in progress.
      // A completed record is an outcome to replay: taken as a claim, the handler would run again.
      const store = redisStore({ client: admin, prefix: `${prefix}race:` });
      const id = randomUUID();
      await store.claim({ id, token: 'mine', fingerprint: 'fp', leaseMs: 5_000 });
      await store.complete({ id, token: 'mine', response: response(new Uint8Array([1])), retentionMs: 60_000 });
      const again = await store.claim({ id, token: 'mine', fingerprint: 'fp', leaseMs: 5_000 });
      expect(again.claimed).toBe(false);
      expect(!again.claimed && again.record.state).toBe('completed');
    });

    it('gives up with StoreContendedError (not StoreUnavailableError) when the key keeps flapping', async () => {
      let sets = 0;
      const store = redisStore({
        client: interposed(async (command, key) => {
          if (command === 'SET') {
            sets++;
            await admin.set(key, 'p"other"\n""\n', 'PX', 60_000);
          }
          if (command === 'GET') await admin.del(key);
        }),
        prefix: `${prefix}race:`,
      });
      const error = await store
        .claim({ id: randomUUID(), token: 'mine', fingerprint: '', leaseMs: 5_000 })
        .catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(StoreContendedError);
      expect(error).not.toBeInstanceOf(StoreUnavailableError);
      // The operator reads why: not a "Redis claim failed" wrapped around the store's own error.
      expect((error as Error).message).toBe('Redis claim kept racing with releases; retry');
      expect(sets).toBe(5);
    });
  });

  describe('a completion sent twice', () => {
    // A store whose client goes through a proxy. ioredis resends the commands that got no reply once
    // it has reconnected (its default), so `sentTwice` runs a command whose reply is lost: Redis runs
    // it, the proxy drops the answer, then cuts the connection, and ioredis sends it again.
    const proxied = async () => {
      const { hostname, port } = new URL(redisUrl);
      const proxy = await createTcpProxy({ target: { host: hostname, port: Number(port || 6379) } });
      const client = new Redis(proxy.port, proxy.host, { retryStrategy: () => 10 });
      client.on('error', () => undefined);
      await client.ping();
      const store = redisStore({ client, prefix: `${prefix}resent:` });
      const sentTwice = async <T>(command: () => Promise<T>, ran: () => Promise<boolean>): Promise<T> => {
        proxy.blackhole('downstream');
        const answer = command();
        while (!(await ran())) await new Promise((resolve) => setTimeout(resolve, 5));
        proxy.cut();
        proxy.restore();
        return answer;
      };
      const close = async () => {
        client.disconnect();
        await proxy.close();
      };
      return { store, sentTwice, close };
    };
    const completed = (store: RedisStore, id: string) => async () =>
      (await admin.getBuffer(store.key(id)))?.[0] === 0x63; // 'c'

    it('a complete whose reply was lost, sent again by ioredis after it reconnected, resolves true', async () => {
      const { store, sentTwice, close } = await proxied();
      try {
        const id = randomUUID();
        expect(await store.claim({ id, token: 'mine', fingerprint: 'fp', leaseMs: 5_000 })).toEqual({ claimed: true });
        const stored = response(new TextEncoder().encode('{"id":"ch_1"}'));
        // The resent script finds the record completed, by this very call.
        const answer = await sentTwice(
          () => store.complete({ id, token: 'mine', response: stored, retentionMs: 60_000 }),
          completed(store, id),
        );
        expect(answer).toBe(true);
        const record = await store.get(id);
        expect(record?.state === 'completed' && Buffer.from(record.response.body).toString()).toBe('{"id":"ch_1"}');
      } finally {
        await close();
      }
    });

    it('through the engine: stored, no lost lease, the signal not aborted', async () => {
      const { store, sentTwice, close } = await proxied();
      try {
        const events: IdempotencyEvent[] = [];
        const engine = createIdempotency({ store, heartbeat: false, onEvent: (event) => events.push(event) });
        const started = await engine.begin({ key: randomUUID(), scope: 'user:1', operation: 'POST /charges' });
        expect(started.kind).toBe('execute');
        if (started.kind !== 'execute') return;
        const { lease } = started;
        const result = await sentTwice(
          () => engine.complete(lease, response(new Uint8Array([42]))),
          completed(store, lease.id),
        );
        expect(result).toEqual({ ok: true, stored: true });
        expect(lease.signal.aborted).toBe(false);
        expect(events.map((event) => event.type)).not.toContain('lease-lost');
      } finally {
        await close();
      }
    });

    it('answers true to the same token with the same outcome, false to the same token with another', async () => {
      const store = redisStore({ client: admin, prefix: `${prefix}twice:` });
      const id = randomUUID();
      await store.claim({ id, token: 'mine', fingerprint: 'f\n"p', leaseMs: 5_000 });
      const first = response(new Uint8Array([1, 10, 2]));
      expect(await store.complete({ id, token: 'mine', response: first, retentionMs: 60_000 })).toBe(true);
      const ttl = await admin.pttl(store.key(id));
      expect(await store.complete({ id, token: 'mine', response: first, retentionMs: 120_000 })).toBe(true);
      // The repeat changes nothing, not even the retention.
      expect(await admin.pttl(store.key(id))).toBeLessThanOrEqual(ttl);
      for (const other of [
        response(new Uint8Array([1, 10])),
        response(new Uint8Array([1, 10, 2, 3])),
        // Same length, only the last byte differs: the comparison runs to the very end.
        response(new Uint8Array([1, 10, 3])),
        response(new Uint8Array([1, 10, 2]), 200),
      ]) {
        expect(await store.complete({ id, token: 'mine', response: other, retentionMs: 60_000 })).toBe(false);
      }
      expect(await store.complete({ id, token: 'other', response: first, retentionMs: 60_000 })).toBe(false);
      const record = await store.get(id);
      expect(record?.state === 'completed' && [...record.response.body]).toEqual([1, 10, 2]);
    });
  });

  describe('misuse', () => {
    const store = redisStore({ client: admin, prefix: `${prefix}misuse:` });

    it('never gets a record it could not read back: the engine refuses it, and the key is free again', async () => {
      const unreadable = [
        { status: 200, headers: { 'content-length': 12 }, body: new Uint8Array(1) },
        { status: 200, headers: { 'set-cookie': ['a=1', 'b=2'] }, body: new Uint8Array(1) },
        { status: Number.NaN, headers: {}, body: new Uint8Array(1) },
        { status: '200', headers: {}, body: new Uint8Array(1) },
        { status: 200, headers: {}, body: 'text' },
      ] as unknown as StoredResponse[];
      let completions = 0;
      const counted: Store = {
        ...store,
        complete: (input) => {
          completions++;
          return store.complete(input);
        },
      };
      const engine = createIdempotency({ store: counted, heartbeat: false });
      for (const bad of unreadable) {
        const request = { key: randomUUID(), scope: 'user:1', operation: 'POST /charges' };
        const first = await engine.begin(request);
        if (first.kind !== 'execute') throw new Error(first.kind);
        // Stored, it would make every later claim of the key a 503 until its retention ran out.
        const result = await engine.complete(first.lease, bad);
        expect(!result.ok && result.error, JSON.stringify(bad)).toBeInstanceOf(InvalidResponseError);
        await expect.poll(() => store.get(first.lease.id)).toBeUndefined();
        expect((await engine.begin(request)).kind).toBe('execute');
      }
      expect(completions).toBe(0);
      for (const [token, fingerprint] of [
        [7, 'fp'],
        ['t', undefined],
      ] as unknown as [string, string][]) {
        const id = randomUUID();
        await expect(store.claim({ id, token, fingerprint, leaseMs: 4_000 })).rejects.toThrow(TypeError);
        expect(await store.get(id)).toBeUndefined();
      }
    });
  });

  // Redis that answered is not Redis unavailable: under fail-open only the latter opens (see
  // reply-errors.int.test.ts).
  describe('failures a Redis that answered reports', () => {
    const store = redisStore({ client: admin, prefix: `${prefix}fail:` });

    it('a reply error (the key holds another type) is RedisCommandError, not StoreUnavailableError', async () => {
      const id = randomUUID();
      await admin.hset(store.key(id), 'f', 'v');
      await admin.pexpire(store.key(id), 60_000);
      for (const attempt of [
        () => store.claim({ id, token: 't', fingerprint: '', leaseMs: 1_000 }),
        () => store.get(id),
        () => store.renew({ id, token: 't', leaseMs: 1_000 }),
        () => store.complete({ id, token: 't', response: response(new Uint8Array(1)), retentionMs: 1_000 }),
        () => store.release({ id, token: 't' }),
        () => store.forget({ id, token: 't' }),
      ]) {
        // One at a time, each awaited at once: a rejection never waits without a handler.
        const error = await attempt().catch((e: unknown) => e);
        expect(error).toMatchObject({ name: 'RedisCommandError', code: 'redis_command_refused', reply: 'WRONGTYPE' });
        expect(error).not.toBeInstanceOf(StoreUnavailableError);
        expect((error as Error).message).not.toContain(id);
      }
    });

    it('a value idem did not write is RecordFormatError, not StoreUnavailableError', async () => {
      const id = randomUUID();
      await admin.set(store.key(id), 'hello', 'PX', 60_000);
      await expect(store.get(id)).rejects.toBeInstanceOf(RecordFormatError);
      await expect(store.claim({ id, token: 't', fingerprint: '', leaseMs: 1_000 })).rejects.toBeInstanceOf(
        RecordFormatError,
      );
      // And a CAS never touches it.
      expect(await store.release({ id, token: 'hello' })).toBe(false);
      expect(await store.forget({ id, token: 'hello' })).toBe(false);
      expect(await admin.get(store.key(id))).toBe('hello');
    });

    it('renew, complete, release and forget leave a value idem did not write alone, one shaped like a record too', async () => {
      const stored = response(new Uint8Array([1]));
      // Token, fingerprint and outcome lines as a completion of token 't' writes them, under a state
      // byte that is neither 'p' nor 'c': no claim of anyone's, and no record completed by 't'.
      const lookalike = Buffer.concat([Buffer.from('x"t"\n""\n'), encodeOutcome(stored)]);
      for (const value of [Buffer.from('hello'), lookalike]) {
        const id = randomUUID();
        await admin.set(store.key(id), value, 'PX', 60_000);
        expect(await store.renew({ id, token: 't', leaseMs: 1_000 })).toBe(false);
        expect(await store.complete({ id, token: 't', response: stored, retentionMs: 1_000 })).toBe(false);
        expect(await store.release({ id, token: 't' })).toBe(false);
        expect(await store.forget({ id, token: 't' })).toBe(false);
        expect((await admin.getBuffer(store.key(id)))?.equals(value)).toBe(true);
      }
    });

    it('sends a script once when it fails with anything but NOSCRIPT', async () => {
      // EVAL is the answer to NOSCRIPT only. After any other failure (a reply error, a timeout, a
      // dropped connection) the EVALSHA may have run: sending the script again would run it twice.
      const real = redisCommandRunner(admin);
      const sent: string[] = [];
      const counting = redisStore({
        client: {
          send: (key, args) => {
            sent.push(String(args[0]));
            return real.send(key, args);
          },
        },
        prefix: `${prefix}fail:`,
      });
      // A renewal that works first, so this Redis has the script cached whatever ran before.
      const warm = randomUUID();
      await counting.claim({ id: warm, token: 't', fingerprint: '', leaseMs: 5_000 });
      expect(await counting.renew({ id: warm, token: 't', leaseMs: 5_000 })).toBe(true);
      const id = randomUUID();
      await admin.hset(counting.key(id), 'f', 'v');
      await admin.pexpire(counting.key(id), 60_000);
      sent.length = 0;
      await expect(counting.renew({ id, token: 't', leaseMs: 1_000 })).rejects.toMatchObject({ reply: 'WRONGTYPE' });
      expect(sent).toEqual(['EVALSHA']);
    });

    it('for a refused connection, with ioredis and node-redis, and the engine answers store_unavailable', async () => {
      const port = await freePort();
      const io = new Redis(port, '127.0.0.1', {
        enableOfflineQueue: false,
        maxRetriesPerRequest: 0,
        retryStrategy: () => null,
      });
      io.on('error', () => undefined);
      const nr = createClient({ url: `redis://127.0.0.1:${port}`, disableOfflineQueue: true });
      nr.on('error', () => undefined);
      for (const client of [io, nr] as RedisClientLike[]) {
        const dead = redisStore({ client, prefix: `${prefix}dead:` });
        const id = randomUUID();
        for (const attempt of [
          () => dead.claim({ id, token: 't', fingerprint: '', leaseMs: 1_000 }),
          () => dead.get(id),
          () => dead.renew({ id, token: 't', leaseMs: 1_000 }),
          () => dead.complete({ id, token: 't', response: response(new Uint8Array(1)), retentionMs: 1_000 }),
          () => dead.release({ id, token: 't' }),
          () => dead.forget({ id, token: 't' }),
        ]) {
          await expect(attempt()).rejects.toBeInstanceOf(StoreUnavailableError);
        }
        const engine = createIdempotency({ store: dead, storeTimeout: '1s' });
        const started = await engine.begin({ key: randomUUID(), scope: 'user:1', operation: 'POST /charges' });
        expect(started.kind === 'reject' && started.error.code).toBe('store_unavailable');
      }
      io.disconnect();
    });
  });

  it('refuses bad options once, at construction', () => {
    expect(() => redisStore({ client: {} as RedisClientLike })).toThrow(TypeError);
    expect(() => redisStore({ client: admin, maxResponseBytes: 0 })).toThrow(TypeError);
    expect(() => redisStore({ client: admin, maxResponseBytes: 1.5 })).toThrow(TypeError);
    expect(() => redisStore({ client: admin, prefix: 5 as unknown as string })).toThrow(TypeError);
  });
});

describe.runIf(withBinaries)('@idem/redis on a fresh redis-server (script cache)', () => {
  let server: RedisServerProcess;
  let client: Redis;
  beforeAll(async () => {
    server = await startRedisServer(0);
    client = new Redis(server.url);
  });
  afterAll(async () => {
    await client?.quit();
    await server?.stop();
  });

  it('falls back from EVALSHA to EVAL on NOSCRIPT, after a start and after SCRIPT FLUSH', async () => {
    const store = redisStore({ client, prefix: 'fresh:' });
    const evals = async () => {
      const info = await client.info('commandstats');
      return Number(/cmdstat_eval:calls=(\d+)/.exec(info)?.[1] ?? 0);
    };
    expect(await evals()).toBe(0);
    const id = randomUUID();
    // The claim is a plain SET NX PX: no script involved.
    expect(await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 })).toEqual({ claimed: true });
    expect(await evals()).toBe(0);
    // The server has never seen the renew script: EVALSHA fails with NOSCRIPT, EVAL runs and caches it.
    expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
    expect(await evals()).toBe(1);
    // Cached now: the next renewal goes by SHA only.
    expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
    expect(await evals()).toBe(1);
    await client.script('FLUSH');
    expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
    expect(await evals()).toBe(2);
    expect(await store.complete({ id, token: 't', response: response(new Uint8Array([1])), retentionMs: 5_000 })).toBe(
      true,
    );
    expect(await evals()).toBe(3);
    expect((await store.get(id))?.state).toBe('completed');
  });
});

// The whole contract with waitForReplicas on, against a real replica: every write leaves with its
// WAIT in one pipeline, and each one the replica acknowledges is answered as before.
describe.runIf(withBinaries)('@idem/redis on a primary with one replica, waitForReplicas on', () => {
  const waitForReplicas = { count: 1, timeout: '2s' } as const;
  const local = startedOnFirstUse(() => startReplicatedRedis());

  describeStore('redisStore with ioredis, waitForReplicas count 1', async () => {
    const client = new Redis((await local()).primary.url);
    const store = redisStore({ client, prefix: 'waited:io:', waitForReplicas });
    return harness(client, store, () => client.quit(), { waitForReplicas });
  });

  describeStore('redisStore with node-redis, waitForReplicas count 1', async () => {
    const client = createClient({ url: (await local()).primary.url });
    await client.connect();
    const store = redisStore({ client, prefix: 'waited:nr:', waitForReplicas });
    return harness(client, store, () => client.close(), { waitForReplicas });
  });

  it('answers 503 for a write the replica does not acknowledge, and still replays what it stored', async () => {
    const client = new Redis((await local()).primary.url);
    try {
      const store = redisStore({ client, prefix: 'waited:paused:', waitForReplicas: { count: 1, timeout: 100 } });
      const stored = { id: randomUUID(), token: 't', fingerprint: '', leaseMs: 5_000 };
      expect(await store.claim(stored)).toEqual({ claimed: true });
      expect(await store.complete({ ...stored, response: response(new Uint8Array([1])), retentionMs: 60_000 })).toBe(
        true,
      );
      // A replica that is away: detached from the primary, so it acknowledges nothing. The last test
      // here, so the full resync after it delays nobody.
      const away = new Redis((await local()).replica.url);
      await away.replicaof('NO', 'ONE');
      try {
        const unreplicated = randomUUID();
        const error = await store
          .claim({ id: unreplicated, token: 't', fingerprint: '', leaseMs: 5_000 })
          .catch((caught: unknown) => caught);
        expect(error).toBeInstanceOf(StoreUnavailableError);
        expect((error as Error).message).toMatch(/0 of 1 replicas acknowledged it within 100 ms/);
        // No handler ran for it, so the claim is not left behind: the retry claims instead of a 409.
        expect(await client.exists(store.key(unreplicated))).toBe(0);
        // The retry of a stored request changes nothing, so its WAIT does not count: it is replayed.
        expect(await store.claim({ ...stored, token: 'u' })).toMatchObject({
          claimed: false,
          record: { state: 'completed' },
        });
      } finally {
        await away.replicaof('127.0.0.1', (await local()).primary.port);
        away.disconnect();
      }
    } finally {
      client.disconnect();
    }
  });
});

describe.runIf(withBinaries)('@idem/redis on a 3-master Redis Cluster', () => {
  const local = startedOnFirstUse(() => startRedisCluster());

  describeStore('redisStore with ioredis Cluster', async () => {
    const { nodes } = await local();
    const client = new Cluster([...nodes]);
    return harness(client, redisStore({ client, prefix: 'idem:io:' }), () => client.quit());
  });

  describeStore('redisStore with node-redis cluster', async () => {
    const { urls } = await local();
    const client = createCluster({ rootNodes: urls.map((url) => ({ url })) });
    await client.connect();
    return harness(client, redisStore({ client, prefix: 'idem:nr:' }), () => client.close());
  });

  it('sends each command to the master that owns its key: no MOVED redirect, with either client', async () => {
    // A client that picks a node at random is redirected with MOVED and still gets the right answer,
    // so only the servers' error counts show that commands went the long way round.
    const { nodes, urls } = await local();
    const masters = nodes.map((node) => new Redis(node.port, node.host));
    const io = new Cluster([...nodes]);
    const nr = createCluster({ rootNodes: urls.map((url) => ({ url })) });
    await nr.connect();
    try {
      for (const client of [io, nr] as RedisClientLike[]) {
        const store = redisStore({ client, prefix: 'routed:' });
        await store.get(randomUUID()); // connects, and learns the slots
        await Promise.all(masters.map((master) => master.config('RESETSTAT')));
        for (let i = 0; i < 12; i++) {
          const id = randomUUID();
          await store.claim({ id, token: 't', fingerprint: '', leaseMs: 5_000 });
          await store.claim({ id, token: 'u', fingerprint: '', leaseMs: 5_000 });
          await store.renew({ id, token: 't', leaseMs: 5_000 });
          await store.complete({ id, token: 't', response: response(new Uint8Array([1])), retentionMs: 5_000 });
          await store.get(id);
        }
        const moved = await Promise.all(
          masters.map(async (master) =>
            Number(/errorstat_MOVED:count=(\d+)/.exec(await master.info('errorstats'))?.[1] ?? 0),
          ),
        );
        expect(moved).toEqual([0, 0, 0]);
      }
    } finally {
      for (const master of masters) master.disconnect();
      await io.quit();
      await nr.close();
    }
  });

  // WAIT names no key; sent on its own, a cluster client would send it to any node. In one pipeline
  // with the write, it goes to the master that owns the write's key: no MOVED anywhere, and that
  // master, which has no replica here, answers 0.
  it('with waitForReplicas, sends each write and its WAIT to the master that owns the key, with either client', async () => {
    const { nodes, urls } = await local();
    const masters = nodes.map((node) => new Redis(node.port, node.host));
    const io = new Cluster([...nodes]);
    const nr = createCluster({ rootNodes: urls.map((url) => ({ url })) });
    await nr.connect();
    try {
      for (const client of [io, nr] as RedisClientLike[]) {
        const store = redisStore({ client, prefix: 'waited:', waitForReplicas: { count: 1, timeout: 50 } });
        await store.get(randomUUID());
        await Promise.all(masters.map((master) => master.config('RESETSTAT')));
        for (let i = 0; i < 6; i++) {
          const error = await store
            .claim({ id: randomUUID(), token: 't', fingerprint: '', leaseMs: 5_000 })
            .catch((caught: unknown) => caught);
          expect((error as Error).message).toMatch(/0 of 1 replicas acknowledged/);
        }
        const stats = await Promise.all(masters.map((master) => master.info('all')));
        expect(stats.map((info) => Number(/errorstat_MOVED:count=(\d+)/.exec(info)?.[1] ?? 0))).toEqual([0, 0, 0]);
        const waits = stats.map((info) => Number(/cmdstat_wait:calls=(\d+)/.exec(info)?.[1] ?? 0));
        const sets = stats.map((info) => Number(/cmdstat_set:calls=(\d+)/.exec(info)?.[1] ?? 0));
        expect(waits).toEqual(sets);
      }
    } finally {
      for (const master of masters) master.disconnect();
      await io.quit();
      await nr.close();
    }
  });

  it('spreads records over the masters (no hash tag funnels them into one slot)', async () => {
    const { nodes } = await local();
    const client = new Cluster([...nodes]);
    const store = redisStore({ client, prefix: 'spread:' });
    for (let i = 0; i < 60; i++) await store.claim({ id: randomUUID(), token: 't', fingerprint: '', leaseMs: 60_000 });
    const counts = await Promise.all(
      nodes.map(async (node) => {
        const one = new Redis(node.port, node.host);
        const keys = await one.keys('spread:*');
        one.disconnect();
        return keys.length;
      }),
    );
    expect(counts.reduce((a, b) => a + b, 0)).toBe(60);
    for (const count of counts) expect(count).toBeGreaterThan(0);
    await client.quit();
  });
});

describe.runIf(withRedis)('replayCache over a real Redis', () => {
  const client = new Redis(redisUrl);
  const cachePrefix = `${prefix}replay-cache:`;
  afterAll(async () => {
    await deleteKeys(client, cachePrefix);
    client.disconnect();
  });

  it("a hot key's replays read Redis once per ttl in each process; a mismatch is answered from the cache too", async () => {
    const redis = redisStore({ client, prefix: cachePrefix });
    const claims = { count: 0 };
    const counted: Store = {
      ...redis,
      claim: (input) => {
        claims.count++;
        return redis.claim(input);
      },
    };
    let t = Date.now();
    const now = () => t;
    const writer = createIdempotency({ store: counted, replayCache: { ttl: '1s' }, now });
    const reader = createIdempotency({ store: counted, replayCache: { ttl: '1s' }, now });
    const input = { key: randomUUID(), scope: 'user:1', operation: 'POST /charges', fingerprint: 'fp' };
    const started = await writer.begin(input);
    if (started.kind !== 'execute') throw new Error('expected execute');
    const stored = response(new TextEncoder().encode('{"id":"ch_1"}'));
    expect(await writer.complete(started.lease, stored)).toEqual({ ok: true, stored: true });
    expect(claims.count).toBe(1);
    for (let i = 0; i < 50; i++) {
      for (const engine of [writer, reader]) expect((await engine.begin(input)).kind).toBe('replay');
    }
    // The writer knew its outcome; the other process read Redis once.
    expect(claims.count).toBe(2);
    const mismatch = await reader.begin({ ...input, fingerprint: 'other' });
    expect(mismatch.kind === 'reject' && mismatch.error.code).toBe('fingerprint_mismatch');
    expect(claims.count).toBe(2);
    t += 1_000;
    const replayed = await reader.begin(input);
    expect(replayed.kind === 'replay' && Buffer.from(replayed.response.body).toString()).toBe('{"id":"ch_1"}');
    expect(claims.count).toBe(3);
  });
});
