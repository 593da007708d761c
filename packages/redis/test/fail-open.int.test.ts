// storeUnavailable: 'fail-open' (anchors case 14) with Redis that cannot be reached: nothing listens
// on the port. Whether the client refuses at once (no offline queue) or queues the command until
// storeTimeout (ioredis's default), the claim fails open, and its event says so.
import { randomUUID } from 'node:crypto';
import { createIdempotency, type IdempotencyEvent } from '@idem/core';
import { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { redisStore } from '../src/index.js';
import { freePort } from './redis-env.js';

const request = () => ({ key: randomUUID(), scope: 'caller', operation: 'POST /charges', fingerprint: 'f' });

describe("storeUnavailable: 'fail-open' with Redis down", () => {
  const clients: Redis[] = [];
  afterEach(() => {
    for (const client of clients.splice(0)) client.disconnect();
  });

  for (const [name, options] of [
    ['refused at once (enableOfflineQueue: false)', { enableOfflineQueue: false, maxRetriesPerRequest: 0 }],
    ["queued until storeTimeout (ioredis's default)", {}],
  ] as const) {
    it(`a claim ${name} runs unprotected; the same under fail-closed is 503`, async () => {
      const port = await freePort();
      const client = new Redis({ host: '127.0.0.1', port, lazyConnect: false, ...options });
      client.on('error', () => undefined);
      clients.push(client);
      const events: IdempotencyEvent[] = [];
      const engine = createIdempotency({
        store: redisStore({ client, prefix: `audit-review:fail-open:${randomUUID()}:` }),
        storeTimeout: '300ms',
        onEvent: (event) => events.push(event),
      });
      expect(await engine.begin({ ...request(), storeUnavailable: 'fail-open' })).toEqual({ kind: 'unprotected' });
      expect(await engine.begin({ ...request(), storeUnavailable: 'fail-closed' })).toMatchObject({
        kind: 'reject',
        error: { code: 'store_unavailable' },
      });
      expect(events).toMatchObject([
        { type: 'store-error', phase: 'claim', unprotected: true },
        { type: 'store-error', phase: 'claim' },
      ]);
      expect('unprotected' in (events[1] as object)).toBe(false);
    });
  }
});
