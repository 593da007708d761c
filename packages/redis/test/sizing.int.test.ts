// docs/stores.md ("Sizing", Redis) and docs/operations.md ("Retention sizing") give the memory a
// record costs, for operators to size `maxmemory` with. What `maxmemory` is compared with is
// `used_memory`, so that is what is measured here: its growth for N records written by the engine
// (43-character id, a 64-character fingerprint, two stored headers, as the docs say), on a
// redis-server of this test's own, so no other traffic moves it.
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createIdempotency } from '@idem/core';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { redisStore } from '../src/index.js';
import { redisBinariesAvailable } from './redis-env.js';
import { type RedisServerProcess, startRedisServer } from './redis-server.js';

const withBinaries = await redisBinariesAvailable();

// The Redis table of docs/stores.md: the first "Memory per key" table, "about N bytes" or "about N KiB".
function documented(): Record<string, number> {
  const text = readFileSync(new URL('../../../docs/stores.md', import.meta.url), 'utf8');
  const table = text.slice(text.indexOf('| Memory per key'));
  const rows: Record<string, number> = {};
  for (const match of table.matchAll(/^\| ([A-Za-z0-9 ,]+?)\s+\| about ([\d.]+) (bytes|KiB)\s+\|$/gm)) {
    const [, record = '', amount = '', unit] = match;
    if (record in rows) break;
    rows[record] = Number(amount) * (unit === 'KiB' ? 1024 : 1);
    if (Object.keys(rows).length === 4) break;
  }
  return rows;
}

describe.runIf(withBinaries)('@idem/redis: the memory per record that the docs give', () => {
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

  const usedMemory = async () => Number(/used_memory:(\d+)/.exec(await client.info('memory'))?.[1]);

  // 3,000 keys: Redis's two hash tables (keys, and their expiry) then have 4,096 slots each, the
  // middle of what a power-of-two table costs per key.
  const records = 3_000;

  it.each([
    ['in progress', undefined],
    ['completed, empty body', 0],
    ['completed, 1 KiB body', 1024],
    ['completed, 10 KiB body', 10 * 1024],
  ] as const)('%s: used_memory grows within 20% of the documented figure', async (record, bodyBytes) => {
    const expected = documented()[record];
    expect(expected, `docs/stores.md has no row for "${record}"`).toBeTypeOf('number');
    await client.flushall();
    const engine = createIdempotency({ store: redisStore({ client, prefix: 'idem:' }), heartbeat: false });
    const before = await usedMemory();
    for (let i = 0; i < records; i += 100) {
      await Promise.all(
        Array.from({ length: 100 }, async () => {
          const started = await engine.begin({
            key: randomUUID(),
            scope: 'user:alice',
            operation: 'POST /orders',
            fingerprint: createHash('sha256').update(randomUUID()).digest('hex'),
          });
          if (started.kind !== 'execute') throw new Error(`expected execute, got ${started.kind}`);
          if (bodyBytes === undefined) return;
          const response = {
            status: 201,
            headers: { 'content-type': 'application/json', location: '/orders/1' },
            body: randomBytes(bodyBytes),
          };
          await engine.complete(started.lease, response);
        }),
      );
    }
    expect(await client.dbsize()).toBe(records);
    const perRecord = ((await usedMemory()) - before) / records;
    expect(perRecord).toBeGreaterThan((expected as number) * 0.8);
    expect(perRecord).toBeLessThan((expected as number) * 1.2);
  });
});
