// Redis as people deploy it: maxmemory with noeviction, an ACL-restricted user, a read-only replica.
// Each case runs on a redis-server of its own (never the shared one), so CONFIG SET and ACL SETUSER
// touch nobody else.
import { randomUUID } from 'node:crypto';
import { type BeginResult, createIdempotency, type IdempotencyEvent, type StoredResponse } from '@idem/core';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RedisClientLike, type RedisStore, redisStore } from '../src/index.js';
import { redisBinariesAvailable } from './redis-env.js';
import { type RedisServerProcess, startRedisServer } from './redis-server.js';
import { type ReplicatedRedis, startReplicatedRedis } from './replicated.js';

const withBinaries = await redisBinariesAvailable();

const response: StoredResponse = { status: 201, headers: { 'content-type': 'text/plain' }, body: Buffer.from('ok') };

const engineOn = (store: RedisStore, events: IdempotencyEvent[] = []) =>
  createIdempotency({ store, storeTimeout: '2s', heartbeat: false, onEvent: (event) => events.push(event) });

const begin = (engine: ReturnType<typeof engineOn>, key: string) =>
  engine.begin({ key, scope: 'user:1', operation: 'POST /orders', fingerprint: 'fp' });

const kindOf = (result: BeginResult) => (result.kind === 'reject' ? `reject:${result.error.code}` : result.kind);

describe.runIf(withBinaries)('@idem/redis on a full Redis with maxmemory-policy noeviction', () => {
  let server: RedisServerProcess;
  let admin: Redis;
  let client: Redis;
  beforeAll(async () => {
    server = await startRedisServer(0, ['--maxmemory-policy', 'noeviction']);
    admin = new Redis(server.url);
    client = new Redis(server.url);
  });
  afterAll(async () => {
    await client?.quit();
    await admin?.quit();
    await server?.stop();
  });
  // maxmemory 1 byte: Redis is "full", every command that may grow memory is refused with OOM.
  const fill = () => admin.config('SET', 'maxmemory', '1');
  const drain = () => admin.config('SET', 'maxmemory', '0');

  it('holds: a claim on a full Redis is a 503 store_unavailable (OOM as its cause); renew and release still work', async () => {
    const events: IdempotencyEvent[] = [];
    const store = redisStore({ client, prefix: 'full-claim:' });
    const engine = engineOn(store, events);
    const held = await begin(engine, randomUUID());
    await fill();
    try {
      const refused = await begin(engine, randomUUID());
      expect(refused.kind === 'reject' && refused.error.status).toBe(503);
      expect(kindOf(refused)).toBe('reject:store_unavailable');
      const failure = events.find((event) => event.type === 'store-error');
      expect(String((failure as { error: Error }).error.cause)).toMatch(/OOM/);
      if (held.kind !== 'execute') throw new Error('not claimed');
      expect(await store.renew({ id: held.lease.id, token: held.lease.token, leaseMs: 5_000 })).toBe(true);
      expect(await engine.release(held.lease)).toEqual({ ok: true });
    } finally {
      await drain();
    }
  });

  // Was a defect: docs/stores.md ("With `noeviction`, a full Redis refuses writes instead: claims fail
  // with 503, which is safe") and docs/operations.md promised that noeviction never makes a retry
  // run twice. But Redis refused the completion script's SET as well (OOM), so a request claimed just
  // before Redis filled up ran its handler and lost its outcome; the engine then released the key,
  // and the client's retry, once memory was free again, ran the operation a second time. The
  // completion script is flagged allow-oom now: the outcome is stored, and replayed even while full.
  it('a request claimed before Redis filled up stores its outcome, and its retry replays it', async () => {
    const store = redisStore({ client, prefix: 'full-rerun:' });
    const engine = engineOn(store);
    const key = randomUUID();
    const first = await begin(engine, key);
    if (first.kind !== 'execute') throw new Error('not claimed');
    // The handler runs (its side effect happens); meanwhile other traffic fills Redis.
    await fill();
    try {
      expect(await engine.complete(first.lease, response)).toEqual({ ok: true, stored: true });
      expect(kindOf(await begin(engine, key))).toBe('replay');
      // A new key still needs a write, which a full Redis refuses.
      expect(kindOf(await begin(engine, randomUUID()))).toBe('reject:store_unavailable');
    } finally {
      await drain();
    }
    expect(kindOf(await begin(engine, key))).toBe('replay');
  });

  // Was a defect: a replay needs no write, yet on a full Redis (noeviction) it is a 503 too. The claim
  // is SET NX PX, which Redis refuses with OOM before it looks at the key (SET is a denyoom command),
  // and redis-store.ts claim() turns that into StoreUnavailableError without reading the record. So
  // exactly when Redis is full, and clients retry, every retry of a completed request gets 503
  // instead of its stored answer, though Redis would serve the GET. Fix: in claim(), on an error
  // reply starting with OOM, GET the key and answer a record that exists (replay, or 409 for one in
  // progress); only a free key is a 503.
  it('a retry of a completed request is replayed while Redis is full', async () => {
    const store = redisStore({ client, prefix: 'full-replay:' });
    const engine = engineOn(store);
    const key = randomUUID();
    const first = await begin(engine, key);
    if (first.kind !== 'execute') throw new Error('not claimed');
    expect(await engine.complete(first.lease, response)).toEqual({ ok: true, stored: true });
    await fill();
    try {
      expect(kindOf(await begin(engine, key))).toBe('replay');
    } finally {
      await drain();
    }
  });
});

describe.runIf(withBinaries)('@idem/redis with an ACL-restricted user and on a replica', () => {
  let server: RedisServerProcess;
  let replica: RedisServerProcess;
  let started: ReplicatedRedis | undefined;
  let admin: Redis;
  beforeAll(async () => {
    // Synced before any test: waitForReplicas below needs the replica to acknowledge (the first cases
    // ran while its initial sync was still going, and WAIT counted none).
    started = await startReplicatedRedis();
    ({ primary: server, replica } = started);
    admin = new Redis(server.url);
    // What the store sends (SET, GET, EVALSHA, EVAL after NOSCRIPT) and what its scripts call
    // (GET, SET, PEXPIRE, PTTL, DEL), on its own prefix only.
    await admin.acl(
      'SETUSER',
      'idem',
      'on',
      '>pw',
      'resetkeys',
      '~acl:*',
      '-@all',
      '+set',
      '+get',
      '+evalsha',
      '+eval',
      '+pexpire',
      '+pttl',
      '+del',
    );
    await admin.acl('SETUSER', 'noscripts', 'on', '>pw', 'resetkeys', '~acl:*', '-@all', '+@read', '+@write');
  });
  afterAll(async () => {
    await admin?.quit();
    await started?.stop();
  });

  const url = (user: string, port = server.port) => `redis://${user}:pw@127.0.0.1:${port}`;
  const clients: Array<[string, (url: string) => Promise<RedisClientLike & object>]> = [
    ['ioredis', async (at) => new Redis(at, { enableReadyCheck: false })],
    ['node-redis', async (at) => createClient({ url: at }).connect()],
    ['node-redis RESP3', async (at) => createClient({ url: at, RESP: 3 }).connect()],
  ];
  const close = async (client: object) => {
    if (client instanceof Redis) client.disconnect();
    else await (client as { quit(): Promise<unknown> }).quit();
  };

  it.each(clients)(
    'holds: SET GET EVALSHA EVAL PEXPIRE PTTL DEL on ~prefix* is all the store needs (%s)',
    async (_name, connect) => {
      await admin.script('FLUSH');
      const client = await connect(url('idem'));
      try {
        const store = redisStore({ client, prefix: 'acl:' });
        const engine = engineOn(store);
        const other = engineOn(store);
        const key = randomUUID();
        const first = await begin(engine, key);
        if (first.kind !== 'execute') throw new Error(kindOf(first));
        expect(kindOf(await begin(other, key))).toBe('reject:in_progress');
        expect(await store.renew({ id: first.lease.id, token: first.lease.token, leaseMs: 5_000 })).toBe(true);
        expect(await engine.complete(first.lease, response)).toEqual({ ok: true, stored: true });
        expect(kindOf(await begin(other, key))).toBe('replay');
      } finally {
        await close(client);
      }
    },
  );

  // docs/stores.md's ACL list was written before waitForReplicas: that option sends WAIT behind every
  // write, which the listed permissions refuse (NOPERM), so every claim was a 503 for a user who
  // followed the list. The list now names +wait for the option; this pins both halves.
  it.each(clients)(
    'with waitForReplicas the documented list needs +wait: without it every claim is a 503 (NOPERM), with it claims are served (%s)',
    async (_name, connect) => {
      const documented = ['+set', '+get', '+evalsha', '+eval', '+pexpire', '+pttl', '+del'];
      await admin.acl('SETUSER', 'idem-nowait', 'on', '>pw', 'resetkeys', '~acl:*', '-@all', ...documented);
      await admin.acl('SETUSER', 'idem-wait', 'on', '>pw', 'resetkeys', '~acl:*', '-@all', ...documented, '+wait');
      const without = await connect(url('idem-nowait'));
      const withWait = await connect(url('idem-wait'));
      try {
        const events: IdempotencyEvent[] = [];
        const waitForReplicas = { count: 1, timeout: '2s' } as const;
        const key = randomUUID();
        const refused = await begin(
          engineOn(redisStore({ client: without, prefix: 'acl:', waitForReplicas }), events),
          key,
        );
        expect(kindOf(refused)).toBe('reject:store_unavailable');
        const failure = events.find((event) => event.type === 'store-error') as { error: Error };
        expect(String(failure.error.cause ?? failure.error)).toMatch(/NOPERM/);

        const store = redisStore({ client: withWait, prefix: 'acl:', waitForReplicas });
        const engine = engineOn(store);
        // docs/stores.md: a claim whose WAIT failed ("an ACL that refuses it") is deleted again by its
        // token before the 503, so the retry claims the key instead of meeting a 409 for a lease.
        const first = await begin(engine, key);
        if (first.kind !== 'execute') throw new Error(kindOf(first));
        expect(await engine.complete(first.lease, response)).toEqual({ ok: true, stored: true });
        expect(kindOf(await begin(engineOn(store), key))).toBe('replay');
      } finally {
        await close(without);
        await close(withWait);
      }
    },
  );

  it.each(clients)(
    'holds: a missing permission is a prompt 503 store_unavailable, the error a RedisCommandError naming NOPERM (%s)',
    async (_name, connect) => {
      const client = await connect(url('noscripts'));
      try {
        const events: IdempotencyEvent[] = [];
        const store = redisStore({ client, prefix: 'acl:' });
        const engine = engineOn(store, events);
        const first = await begin(engine, randomUUID());
        if (first.kind !== 'execute') throw new Error(kindOf(first));
        expect(await engine.complete(first.lease, response)).toMatchObject({ ok: false, reason: 'store-error' });
        const failure = events.find((event) => event.type === 'store-error') as { error: Error };
        // Redis answered: no StoreUnavailableError, so fail-open would stay closed (reply-errors.int.test.ts).
        expect(failure.error).toMatchObject({ name: 'RedisCommandError', reply: 'NOPERM' });
        expect(failure.error.message).toMatch(/^Redis complete was refused: NOPERM /);
        const outside = redisStore({ client, prefix: 'elsewhere:' });
        expect(kindOf(await begin(engineOn(outside), randomUUID()))).toBe('reject:store_unavailable');
      } finally {
        await close(client);
      }
    },
  );

  it.each(clients)(
    'holds: a store pointed at a read-only replica answers 503 store_unavailable, READONLY as its cause (%s)',
    async (_name, connect) => {
      const client = await connect(`redis://127.0.0.1:${replica.port}`);
      try {
        const events: IdempotencyEvent[] = [];
        const result = await begin(engineOn(redisStore({ client, prefix: 'acl:' }), events), randomUUID());
        expect(kindOf(result)).toBe('reject:store_unavailable');
        const failure = events.find((event) => event.type === 'store-error') as { error: Error };
        expect(String(failure.error.cause)).toMatch(/READONLY/);
      } finally {
        await close(client);
      }
    },
  );
});
