import { type Duration, recordId } from '@idem/core';
import { redisStore } from '@idem/redis';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { createReceiver, createSigner, type Receiver } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const signer = createSigner({ secret: SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"amount":4200}}');
const recordIdOf = (id: string) => recordId('webhooks', 'webhook', id);
const prefix = `idem-webhooks-test:${process.pid}:${Date.now()}:`;

const available = serviceAvailable(
  `Redis at ${redisUrl}`,
  await redisAnswers(redisUrl),
  'the @idem/webhooks Redis receiver tests',
);

describe.skipIf(!available)('receiver records in Redis', () => {
  const clients: Redis[] = [];
  const connect = () => {
    const client = new Redis(redisUrl);
    client.on('error', () => undefined);
    clients.push(client);
    return client;
  };
  afterAll(async () => {
    const admin = clients[0];
    if (admin) {
      const keys = await admin.keys(`${prefix}*`);
      if (keys.length) await admin.del(...keys);
    }
    for (const client of clients) client.disconnect();
  });

  const worker = (applied: string[], retention?: Duration) => {
    const store = redisStore({ client: connect(), prefix });
    return {
      store,
      receiver: createReceiver({
        store,
        secret: SECRET,
        ...(retention === undefined ? {} : { retention }),
        apply: (event) => void applied.push(event.id),
      }),
    };
  };
  const deliver = (receiver: Receiver, id: string, payload = body) =>
    receiver.handle({ headers: signer.sign({ id, body: payload, timestamp: new Date() }), body: payload });

  it('applies once across four workers on separate connections, the others get 409 (case 3)', async () => {
    const applied: string[] = [];
    const workers = Array.from({ length: 4 }, () => worker(applied).receiver);
    const responses = await Promise.all(Array.from({ length: 20 }, (_, i) => deliver(workers[i % 4]!, 'R1')));
    expect(applied).toEqual(['R1']);
    expect(responses.filter((r) => r.outcome === 'applied')).toHaveLength(1);
    expect(responses.every((r) => r.status === 200 || r.status === 409)).toBe(true);
    expect((await deliver(workers[1]!, 'R1')).outcome).toBe('duplicate');
  });

  it('keeps the id for the default retention of 7 days, by the Redis clock, and refuses a changed body (cases 8, 9)', async () => {
    const applied: string[] = [];
    const { receiver, store } = worker(applied);
    await deliver(receiver, 'R2');
    const ttl = await clients[0]!.pttl(store.key(recordIdOf('R2')));
    expect(ttl).toBeGreaterThan(7 * 24 * 3_600_000 - 60_000);
    expect(ttl).toBeLessThanOrEqual(7 * 24 * 3_600_000);
    const changed = await deliver(receiver, 'R2', Buffer.from('{"type":"payment.succeeded","data":{"amount":1}}'));
    expect(changed).toMatchObject({ status: 422, outcome: 'mismatch' });
    expect(applied).toEqual(['R2']);
  });
});
