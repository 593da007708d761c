// The API's idempotency event trail (docs/operations.md, "Investigating one key"): by default the
// events an operator must look at (a store error, a claim that took over a crashed attempt, ...) go
// to stderr, one line each, naming the record id support computes from a ticket with
// `recordId(principalScope(...), operation, key)`, and never the key, the caller, a token or a body.
// Ordinary events (a claim, a replay, a completion) write nothing.
//
// The store that fails is the one Redis holds `POST /photos`'s keys in, with Redis down: an ioredis
// client that never connected and queues nothing, so every command fails at once. Charges keep their
// keys in the database (PGlite, or PostgreSQL with DATABASE_URL). The crashed attempt is made the way a
// crash leaves it: the record of a charge put back in progress with its lease over (the database's
// clock, so nothing waits for a lease to run out).
import { randomUUID } from 'node:crypto';
import { parseIdempotencyKey, principalScope, recordId } from '@idem/core';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { apiTables } from '../src/schema/api-schema.js';
import { postCapturingStderr } from './stderr-lines.js';
import { startTestStack, type TestStack } from './test-stack.js';

const sub = 'user-events';
const clientId = 'photo-app';

describe('the API logs the idempotency events an operator must see, by record id', () => {
  let test: TestStack;
  let deadRedis: Redis;
  let token: string;
  const written: string[] = [];
  // The record ids of this caller's keys, as the docs' ticketRecordId computes them (with the
  // reference app's `perClient` scope).
  const recordOf = (operation: string, keyHeader: string) => {
    const parsed = parseIdempotencyKey(keyHeader);
    if (!parsed.ok) throw new Error('not a key');
    const scope = principalScope({ iss: test.issuer, sub, clientId }, { perClient: true });
    if (scope === undefined) throw new Error('no scope');
    return recordId(scope, operation, parsed.key);
  };

  beforeAll(async () => {
    // Redis down: nothing listens on port 1, the client never connects, and it queues no command.
    deadRedis = new Redis('redis://127.0.0.1:1', {
      lazyConnect: true,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
    });
    deadRedis.on('error', () => undefined);
    test = await startTestStack('api_events', { seed: false, redis: { client: deadRedis, prefix: 'audit-apitrail:' } });
    token = await test.token({ sub, clientId });
  }, 60_000);

  afterAll(async () => {
    await test?.close();
    deadRedis?.disconnect();
  });

  /** Sends a request and returns it with every line written on stderr while it ran. */
  const send = (path: string, keyHeader: string, body: unknown) =>
    postCapturingStderr(new URL(path, test.stack.gateway.url), { token, keyHeader, body }, written);

  // Whatever a line says, it names none of what the request carried.
  afterAll(() => {
    for (const line of written) {
      expect(line).not.toMatch(/bearer|authorization/i);
      expect(line).not.toContain(token);
      // No JWT at all (the gateway's internal token): a record id is base64url without dots.
      expect(line).not.toMatch(/eyJ[\w-]+\.[\w-]+\./);
      expect(line).not.toContain(sub);
      expect(line).not.toContain(test.issuer);
      expect(line).not.toMatch(/secret-title|"amount"|"title"|k-events-/);
    }
  });

  it('a store error is one line with the record id, the operation and the store phase', {
    timeout: 30_000,
  }, async () => {
    const keyHeader = `"k-events-${randomUUID()}"`;
    const { response, lines } = await send('/photos', keyHeader, { title: 'secret-title of a photo' });
    expect(response.status).toBe(503);
    const id = recordOf('POST /photos', keyHeader);
    const about = lines.filter((line) => line.includes(id));
    expect(about).toHaveLength(1);
    expect(about[0]).toMatch(/^API: idempotency store-error /);
    expect(about[0]).toContain('POST /photos');
    expect(about[0]).toContain('phase claim');
    expect(about[0]).toContain('StoreUnavailableError');
    expect(lines).toEqual(about);
  });

  it('a charge that runs and a retry that replays it write nothing', { timeout: 30_000 }, async () => {
    const keyHeader = `"k-events-${randomUUID()}"`;
    const first = await send('/charges', keyHeader, { amount: 4242, currency: 'EUR' });
    expect(first.response.status).toBe(201);
    // The replay comes only once the first one's record completed: its events are all in.
    const replay = await send('/charges', keyHeader, { amount: 4242, currency: 'EUR' });
    expect(replay.response.status).toBe(201);
    expect(replay.response.headers.get('idempotent-replayed')).toBe('true');
    expect([...first.lines, ...replay.lines]).toEqual([]);
  });

  it('a claim that takes over a crashed attempt is one line with the record id: it may have run twice', {
    timeout: 30_000,
  }, async () => {
    const keyHeader = `"k-events-${randomUUID()}"`;
    const first = await send('/charges', keyHeader, { amount: 4343, currency: 'EUR' });
    expect(first.response.status).toBe(201);
    const id = recordOf('POST /charges', keyHeader);
    // What a process killed in the middle of the charge leaves: its claim, its lease over.
    const { rowCount } = await test.db.query(
      `update ${apiTables.idempotency}
          set state = 'in_progress', status = null, headers = null, body = null,
              lease_until = clock_timestamp() - interval '1 second'
        where id = $1`,
      [id],
    );
    expect(rowCount).toBe(1);
    const retry = await send('/charges', keyHeader, { amount: 4343, currency: 'EUR' });
    expect(retry.response.status).toBe(201);
    expect(retry.response.headers.get('idempotent-replayed')).toBeNull();
    const about = retry.lines.filter((line) => line.includes(id));
    expect(about).toHaveLength(1);
    expect(about[0]).toMatch(/^API: idempotency claim /);
    expect(about[0]).toContain('POST /charges');
    expect(about[0]).toMatch(/crashed attempt/);
    expect(retry.lines).toEqual(about);
  });
});
