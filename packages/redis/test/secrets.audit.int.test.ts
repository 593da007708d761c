// Audit (branch audit-secrets): what a failed store call hands to onEvent. security.md says "Nothing
// secret reaches a message, an event or a log ... engine events carry the hashed record id", and calls
// response bodies "the sensitive part". The redis-server here is this file's own (never the shared one).
import { createIdempotency, type IdempotencyEvent } from '@idem/core';
import { reachableText } from '@idem/testkit';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { redisStore } from '../src/index.js';
import { redisBinariesAvailable } from './redis-env.js';
import { type RedisServerProcess, startRedisServer } from './redis-server.js';

const withBinaries = await redisBinariesAvailable();

const BODY = '{"card":"4111111111111111","email":"planted-person@example.com"}';

describe.runIf(withBinaries)('a completion Redis refuses (a failover left the client on a replica)', () => {
  let server: RedisServerProcess;
  let admin: Redis;
  let client: Redis;

  beforeAll(async () => {
    server = await startRedisServer(0);
    admin = new Redis(server.url);
    client = new Redis(server.url);
  });

  afterAll(async () => {
    client?.disconnect();
    admin?.disconnect();
    await server?.stop();
  });

  // Was a defect: the store-error event of a failed completion (and complete()'s result) carries ioredis's
  // ReplyError as `cause`, and ioredis puts the whole command on it (`command.args`): the encoded record
  // with the handler's full response body, here a card number and an email address. Any logger that
  // serializes the event's error with its cause (pino's err serializer, util.inspect, console.error)
  // writes the body to the log. Expected: the event carries no payload; wrap ioredis's error in one
  // that keeps its name and message only (or drop `command` from it) in redis-store.ts guarded().
  it('the store-error event of a refused completion does not carry the response body', async () => {
    const events: IdempotencyEvent[] = [];
    const engine = createIdempotency({
      store: redisStore({ client, prefix: 'audit-secrets:' }),
      onEvent: (event) => events.push(event),
    });
    const started = await engine.begin({ key: 'k-1', scope: 'user-1', operation: 'POST /charges', fingerprint: 'fp' });
    expect(started.kind).toBe('execute');
    if (started.kind !== 'execute') return;
    // The server becomes a replica (of nothing reachable): every write is refused with READONLY.
    await admin.call('REPLICAOF', '127.0.0.1', '1');
    try {
      const completed = await engine.complete(started.lease, {
        status: 201,
        headers: { 'content-type': 'application/json' },
        body: new TextEncoder().encode(BODY),
      });
      expect(completed).toMatchObject({ ok: false, reason: 'store-error' });
    } finally {
      await admin.call('REPLICAOF', 'NO', 'ONE');
    }
    const storeErrors = events.filter((event) => event.type === 'store-error');
    expect(storeErrors).toHaveLength(1);
    const reachable = reachableText(storeErrors[0]).join('\n');
    expect(reachable).toContain('READONLY'); // the cause is there, as it should be
    expect(reachable).not.toContain('4111111111111111');
    expect(reachable).not.toContain('planted-person@example.com');
  });
});
