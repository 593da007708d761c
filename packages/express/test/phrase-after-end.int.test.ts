// A reason phrase or status set right after `res.end()`, over a store across the network (Redis):
// the capture holds the end until the outcome is stored, so the head had not left yet and went out
// with what the response said then, while the record kept the status line of the end. Node ignores
// what is set after end(): the first answer and its replays say the status line of the end.
import { randomBytes } from 'node:crypto';
import { redisStore } from '@idem/redis';
import express from 'express';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { deleteKeys, redisAvailable, redisUrl } from '../../redis/test/redis-env.js';
import { idempotency } from '../src/index.js';
import { serve } from './support.js';

const withRedis = await redisAvailable();
const prefix = `audit-capture:phrase-after-end:${randomBytes(4).toString('hex')}:`;
let client: Redis;

beforeAll(() => {
  if (withRedis) client = new Redis(redisUrl);
});
afterAll(async () => {
  if (!withRedis) return;
  await deleteKeys(client, prefix);
  await client.quit();
});

const post = (url: string, key: string) =>
  fetch(`${url}/charges`, { method: 'POST', headers: { 'idempotency-key': key }, signal: AbortSignal.timeout(5_000) });

it.runIf(withRedis)('Redis: the first answer and its replay say the status line of the end', async () => {
  const app = express();
  app.use(idempotency({ store: redisStore({ client, prefix }), scope: () => 'tenant-1' }));
  app.post('/charges', (_req, res) => {
    res.statusMessage = 'Created Fine';
    res.status(201).json({ id: 'ch_1' });
    res.statusMessage = 'Set After End';
    res.statusCode = 202;
  });
  await serve(app, async (url) => {
    const first = await post(url, 'k-1');
    expect([first.status, first.statusText, await first.text()]).toEqual([201, 'Created Fine', '{"id":"ch_1"}']);
    const again = await post(url, 'k-1');
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect([again.status, again.statusText, await again.text()]).toEqual([201, 'Created Fine', '{"id":"ch_1"}']);
  });
});
