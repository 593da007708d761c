// Was a defect: on an ioredis client with `enableAutoPipelining: true` every store call fails, because ioredis's auto-pipeline path drops the command name of callBuffer(), which command-runner.ts sends everything through.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { redisStore } from '../src/index.js';
import { deleteKeys, redisAvailable, redisUrl } from './redis-env.js';

const withRedis = await redisAvailable();
const prefix = `idem-test:redis-compat-audit:${randomUUID()}:`;

describe.runIf(withRedis)('@idem/redis on ioredis clients configured as users configure them', () => {
  const admin = new Redis(redisUrl);
  afterAll(async () => {
    await deleteKeys(admin, prefix);
    await admin.quit();
  });

  // `enableAutoPipelining` is ioredis's documented throughput option; the store accepts "an ioredis
  // client" with no exception for it. ioredis (5.11.1 in the lockfile, also 5.0.0 and 6.0.0) re-adds
  // the command name only for call(), not callBuffer(), when it batches a command into its
  // auto-pipeline (ioredis built/autoPipelining.js, executeWithAutoPipelining), so Redis received
  // `<key> <value> NX PX ...` and answered "ERR unknown command": every claim was a store error, every
  // request a 503. The runner now calls the per-command Buffer methods (setBuffer, evalshaBuffer, ...).
  it('claims, renews, completes and reads a record through a client with enableAutoPipelining', async () => {
    const client = new Redis(redisUrl, { enableAutoPipelining: true });
    try {
      const store = redisStore({ client, prefix });
      const id = randomUUID();
      expect(await store.claim({ id, token: 't', fingerprint: 'f', leaseMs: 5_000 })).toEqual({ claimed: true });
      expect(await store.renew({ id, token: 't', leaseMs: 5_000 })).toBe(true);
      const response = { status: 201, headers: {}, body: new Uint8Array([1, 2, 3]) };
      expect(await store.complete({ id, token: 't', response, retentionMs: 60_000 })).toBe(true);
      const record = await store.get(id);
      expect(record?.state).toBe('completed');
    } finally {
      client.disconnect();
    }
  });
});
