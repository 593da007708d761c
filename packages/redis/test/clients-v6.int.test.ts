import { randomUUID } from 'node:crypto';
import { createIdempotency } from '@idem/core';
import { describeStore } from '@idem/testkit';
import { afterAll, describe, expect, it } from 'vitest';
import { type RedisClientLike, redisStore } from '../src/index.js';
import { deleteKeys, redisAvailable, redisUrl } from './redis-env.js';
import { redisStoreHarness } from './store-harness.js';

// @idem/redis declares `ioredis` and `redis` ^5 || ^6 as peers, and the repository's own tests run on
// 5 (the root's dev dependencies). These are the 6 majors, installed under aliases: the whole store
// contract on each, so the upper half of the declared range is tested as the lower one is.
const { Redis } = (await import('ioredis-6' as string)) as typeof import('ioredis');
const { createClient } = (await import('redis-6' as string)) as typeof import('redis');
const withRedis = await redisAvailable();
const prefix = `idem-test:redis-v6:${randomUUID()}:`;

describe.runIf(withRedis)('@idem/redis on the 6 majors of its peer clients', () => {
  const admin = new Redis(redisUrl);
  afterAll(async () => {
    await deleteKeys(admin, prefix);
    await admin.quit();
  });

  it('runs the installed 6 majors (not the 5 the other tests use)', async () => {
    const versionOf = async (name: string) =>
      ((await import(`${name}/package.json` as string, { with: { type: 'json' } })) as { default: { version: string } })
        .default.version;
    expect(await versionOf('ioredis-6')).toMatch(/^6\./);
    expect(await versionOf('redis-6')).toMatch(/^6\./);
  });

  describeStore('redisStore with ioredis 6', async () => {
    const client = new Redis(redisUrl);
    return redisStoreHarness(client, redisStore({ client, prefix: `${prefix}io:` }), () => client.quit());
  });

  describeStore('redisStore with node-redis 6', async () => {
    const client = createClient({ url: redisUrl });
    await client.connect();
    return redisStoreHarness(client as RedisClientLike, redisStore({ client, prefix: `${prefix}nr:` }), () =>
      client.close(),
    );
  });

  it('an engine on node-redis 6 lets one of concurrent claims run, then replays its answer, reason phrase included', async () => {
    const client = createClient({ url: redisUrl });
    await client.connect();
    try {
      const engine = createIdempotency({ store: redisStore({ client, prefix: `${prefix}engine:` }), heartbeat: false });
      const request = { key: randomUUID(), scope: 'user:1', operation: 'POST /things' };
      const begun = await Promise.all(Array.from({ length: 8 }, () => engine.begin(request)));
      const running = begun.filter((result) => result.kind === 'execute');
      expect(running).toHaveLength(1);
      const [first] = running;
      if (first?.kind !== 'execute') return;
      const response = { status: 201, headers: {}, body: Buffer.from('made'), statusMessage: 'Made Fine' };
      expect(await engine.complete(first.lease, response)).toEqual({ ok: true, stored: true });
      const again = await engine.begin(request);
      expect(again.kind).toBe('replay');
      if (again.kind !== 'replay') return;
      expect(again.response.statusMessage).toBe('Made Fine');
      expect(Buffer.from(again.response.body).toString()).toBe('made');
    } finally {
      await client.close();
    }
  });
});
