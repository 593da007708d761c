// Redis that answered with an error is not Redis that could not be reached. Under
// storeUnavailable: 'fail-open' only the latter runs a request unprotected (as on PostgreSQL, whose
// SQL and schema mistakes fail closed): an ACL that denies the store's commands, someone else's key
// under the prefix, a command Redis does not know, would otherwise run every request unprotected,
// silently, for as long as the misconfiguration lasts.
import { randomUUID } from 'node:crypto';
import { inspect } from 'node:util';
import {
  createIdempotency,
  type IdempotencyEvent,
  isStoreUnavailableError,
  recordId,
  type Store,
  StoreUnavailableError,
} from '@idem/core';
import { Redis, ReplyError } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RedisCommandRunner, redisCommandRunner, redisStore } from '../src/index.js';
import { deleteKeys, redisAvailable, redisUrl } from './redis-env.js';

const withRedis = await redisAvailable();
const prefix = `audit-redisans:reply-errors:${randomUUID()}:`;
const aclUser = `audit-redisans-user-${randomUUID()}`;
const request = () => ({
  key: randomUUID(),
  scope: 'caller',
  operation: 'POST /charges',
  fingerprint: 'fp-secret-7f3a',
});

// The engine under fail-open on `store`, with its events: the request must be refused with 503
// (the handler never runs), and the claim's store-error event must not say `unprotected`.
async function failsClosed(store: Store) {
  const events: IdempotencyEvent[] = [];
  const engine = createIdempotency({ store, onEvent: (event) => events.push(event) });
  const started = await engine.begin({ ...request(), storeUnavailable: 'fail-open' });
  expect(started).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable', status: 503 } });
  expect(started.kind === 'reject' && started.error.retryAfter).toBeGreaterThan(0);
  expect(events).toMatchObject([{ type: 'store-error', phase: 'claim' }]);
  expect(events.some((event) => 'unprotected' in event)).toBe(false);
  return (events[0] as { error: unknown }).error;
}

describe.runIf(withRedis)("storeUnavailable: 'fail-open' with Redis that answers an error", () => {
  let admin: Redis;
  const clients: Redis[] = [];
  beforeAll(() => {
    admin = new Redis(redisUrl);
  });
  afterAll(async () => {
    for (const client of clients) client.disconnect();
    await admin.call('ACL', 'DELUSER', aclUser);
    await deleteKeys(admin, prefix);
    admin.disconnect();
  });

  it('an ACL that denies the claim (NOPERM) fails closed', async () => {
    // Allowed to connect and read, not to write or run scripts.
    await admin.call('ACL', 'SETUSER', aclUser, 'on', 'nopass', '~*', '-@all', '+get', '+info', '+ping');
    const client = new Redis(redisUrl, { username: aclUser, password: 'any' });
    clients.push(client);
    const error = await failsClosed(redisStore({ client, prefix: `${prefix}acl:` }));
    expect(isStoreUnavailableError(error)).toBe(false);
    expect((error as Error).message).toMatch(/^Redis claim was refused: NOPERM /);
    expect(error).toMatchObject({ code: 'redis_command_refused', reply: 'NOPERM' });
  });

  // After the handler, a refused completion is handled as PostgreSQL's non-transient errors are, and
  // as an unavailable Redis was: a store-error event, the completion tried again in the background
  // with the key held (here it lands once the grant is fixed), no answer changed.
  it('a refused completion (NOPERM) is tried again in the background, and lands once the grant is fixed', async () => {
    const user = `${aclUser}-complete`;
    await admin.call('ACL', 'SETUSER', user, 'on', 'nopass', '~*', '-@all', '+set', '+get', '+info', '+ping');
    const client = new Redis(redisUrl, { username: user, password: 'any' });
    try {
      const store = redisStore({ client, prefix: `${prefix}complete:` });
      const events: IdempotencyEvent[] = [];
      const engine = createIdempotency({
        store,
        heartbeat: false,
        onEvent: (event) => events.push(event),
        [Symbol.for('@idem/core.completionRetryPauses')]: () => 200,
      } as Parameters<typeof createIdempotency>[0]);
      const first = request();
      const started = await engine.begin(first);
      if (started.kind !== 'execute') throw new Error(started.kind);
      const response = { status: 201, headers: {}, body: new Uint8Array([1]) };
      const completed = await engine.complete(started.lease, response);
      expect(completed).toMatchObject({ ok: false, reason: 'store-error', error: { reply: 'NOPERM' } });
      expect(events).toMatchObject([
        { type: 'claim' },
        { type: 'store-error', phase: 'complete', error: { name: 'RedisCommandError' } },
      ]);
      await admin.call('ACL', 'SETUSER', user, '+evalsha', '+eval', '+pexpire', '+pttl', '+del');
      const id = recordId(first.scope, first.operation, first.key);
      await expect.poll(async () => (await store.get(id))?.state, { timeout: 5_000 }).toBe('completed');
    } finally {
      client.disconnect();
      await admin.call('ACL', 'DELUSER', user);
    }
  });

  it("someone else's key at the record's key (WRONGTYPE) fails closed", async () => {
    const store = redisStore({ client: admin, prefix: `${prefix}wrongtype:` });
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, onEvent: (event) => events.push(event) });
    const first = request();
    await admin.lpush(store.key(recordId(first.scope, first.operation, first.key)), 'not idem');
    const started = await engine.begin({ ...first, storeUnavailable: 'fail-open' });
    expect(started).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable', status: 503 } });
    expect(events).toMatchObject([{ type: 'store-error', phase: 'claim', error: { reply: 'WRONGTYPE' } }]);
    expect(events.some((event) => 'unprotected' in event)).toBe(false);
  });

  it("someone else's string at the record's key (not an idem record) fails closed", async () => {
    const store = redisStore({ client: admin, prefix: `${prefix}foreign:` });
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({ store, onEvent: (event) => events.push(event) });
    const first = request();
    await admin.set(store.key(recordId(first.scope, first.operation, first.key)), 'hello');
    const started = await engine.begin({ ...first, storeUnavailable: 'fail-open' });
    expect(started).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable', status: 503 } });
    expect(events).toMatchObject([{ type: 'store-error', phase: 'claim', error: { name: 'RecordFormatError' } }]);
    expect(events.some((event) => 'unprotected' in event)).toBe(false);
  });

  // Redis echoes the first arguments of a command it does not know ("ERR unknown command 'SETX',
  // with args beginning with: 'key' 'value' ..."), and ioredis keeps them on the error: the key,
  // the token and the fingerprint of the claim. None of it may reach the event, and from it a log.
  it('a command Redis does not know fails closed, and its error carries none of the values sent', async () => {
    const real = redisCommandRunner(admin);
    const renamed: RedisCommandRunner = {
      send: (key, [command, ...args]) => real.send(key, [command === 'SET' ? 'SETX' : (command as string), ...args]),
    };
    const store = redisStore({ client: renamed, prefix: `${prefix}unknown:` });
    const error = await failsClosed(store);
    expect(isStoreUnavailableError(error)).toBe(false);
    expect(error).toMatchObject({ name: 'RedisCommandError', code: 'redis_command_refused', reply: 'ERR' });
    expect((error as Error).message).toMatch(/^Redis claim was refused: ERR unknown command/);
    const shown = inspect(error, { depth: 10, showHidden: true }) + JSON.stringify(error);
    expect(shown).not.toContain(prefix);
    expect(shown).not.toContain('fp-secret-7f3a');
    expect(shown).not.toContain('with args');

    // The store's own answer, asked directly: the same, naming its operation, with a known token.
    const direct = await store
      .claim({ id: randomUUID(), token: 'token-secret-91', fingerprint: 'fp-secret-7f3a', leaseMs: 5_000 })
      .catch((caught: unknown) => caught);
    expect((direct as Error).message).toMatch(/^Redis claim was refused: ERR /);
    expect(inspect(direct, { depth: 10, showHidden: true })).not.toMatch(/token-secret-91|fp-secret-7f3a/);
  });

  it('a refused renew, complete or release is refused the same way, naming its operation', async () => {
    const store = redisStore({ client: admin, prefix: `${prefix}ops:` });
    const id = randomUUID();
    await admin.lpush(store.key(id), 'not idem');
    const token = 'token-secret-92';
    const body = new TextEncoder().encode('body-secret-93');
    for (const [operation, call] of [
      ['renew', () => store.renew({ id, token, leaseMs: 1_000 })],
      [
        'complete',
        () => store.complete({ id, token, response: { status: 201, headers: {}, body }, retentionMs: 1_000 }),
      ],
      ['release', () => store.release({ id, token })],
      ['forget', () => store.forget({ id, token })],
      ['get', () => store.get(id)],
    ] as const) {
      const error = await (call as () => Promise<unknown>)().catch((caught: unknown) => caught);
      expect(isStoreUnavailableError(error)).toBe(false);
      expect(error).toMatchObject({ code: 'redis_command_refused', reply: 'WRONGTYPE' });
      expect((error as Error).message).toMatch(new RegExp(`^Redis ${operation} was refused: WRONGTYPE `));
      expect(inspect(error, { depth: 10, showHidden: true })).not.toMatch(/secret/);
    }
  });

  // The key freed and taken again between every SET NX and GET: Redis answered each time, the key
  // is live elsewhere. Opened, the request would run beside that live holder.
  it('a claim that keeps racing with releases fails closed, 503 with Retry-After', async () => {
    const real = redisCommandRunner(admin);
    const flapping: RedisCommandRunner = {
      send: async (key, args) => {
        if (args[0] === 'SET') await admin.set(key, 'p"other"\n""\n', 'PX', 60_000);
        if (args[0] === 'GET') await admin.del(key);
        return real.send(key, args);
      },
    };
    const error = await failsClosed(redisStore({ client: flapping, prefix: `${prefix}flapping:` }));
    expect(error).toMatchObject({ name: 'StoreContendedError', code: 'store_contended' });
  });

  it('a transient reply (LOADING, READONLY, OOM...) is still StoreUnavailableError, and opens', async () => {
    const real = redisCommandRunner(admin);
    for (const reply of [
      'LOADING Redis is loading the dataset in memory',
      "READONLY You can't write against a read only replica.",
    ]) {
      const store = redisStore({
        client: {
          send: (key, args) => (args[0] === 'SET' ? Promise.reject(new ReplyError(reply)) : real.send(key, args)),
        },
        prefix: `${prefix}transient:`,
      });
      const error = await store
        .claim({ id: randomUUID(), token: 't', fingerprint: 'f', leaseMs: 1_000 })
        .catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(StoreUnavailableError);
      const engine = createIdempotency({ store });
      expect(await engine.begin({ ...request(), storeUnavailable: 'fail-open' })).toEqual({ kind: 'unprotected' });
    }
  });
});
