// Audit (secret rotation on a live system): a Standard Webhooks secret is rotated while events wait in
// the PostgreSQL outbox and the receiver records ids in Redis. Each step below is one a runbook
// (docs/operations.md, "Rotating secrets and keys") tells an operator to take, in both orders: the
// receiver first (it trusts new and old, then the sender switches), and the sender first (it signs
// with both, then receivers switch). What must hold: no event is lost or applied twice, a delivery
// refused by a receiver not rotated yet is retried and lands once it is, and the receiver's record of
// an id does not depend on the secret (a retry signed with the new secret of an event applied under
// the old one is a duplicate, not a second effect).
import { redisStore } from '@idem/redis';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createOutbox,
  createReceiver,
  createSender,
  createSigner,
  generateSecret,
  type Receiver,
  type WebhookSecret,
} from '../src/index.js';
import { type Endpoint, startEndpoint } from './support/endpoint.js';
import { postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const redisUp = serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), 'the webhook rotation audit');
const postgresUp = await postgresAvailable('rotation audit');
const prefix = `audit-rotation:webhooks:${process.pid}:${Date.now()}:`;

const hmac = () => (generateSecret('v1') as { secret: string }).secret;
const ed25519 = () => generateSecret('v1a') as { privateKey: string; publicKey: string };
const body = (n: number) => JSON.stringify({ type: 'payment.succeeded', data: { n } });

describe.skipIf(!redisUp || !postgresUp)('rotating a webhook secret on a live system', () => {
  const redis = new Redis(redisUrl);
  redis.on('error', () => undefined);
  const pool = testPool({ max: 4 });
  const endpoints: Endpoint[] = [];
  const tables: string[] = [];

  // One Redis store for the receiver's ids, whatever secrets a receiver object holds: a rotated
  // receiver is a new object (a restart with new configuration) on the same records.
  const store = redisStore({ client: redis, prefix });
  const applied: string[] = [];
  const receiverWith = (secret: WebhookSecret | readonly WebhookSecret[]): Receiver =>
    createReceiver({ store, secret, apply: (event) => void applied.push(event.id), onWarning: () => undefined });

  // The endpoint stays up across a rotation: `swap` replaces the receiver behind it, as a rolling
  // restart of the receiving service does.
  async function liveEndpoint(initial: Receiver) {
    let current = initial;
    const endpoint = await startEndpoint({ handle: (input) => current.handle(input) } as Receiver);
    endpoints.push(endpoint);
    return {
      url: endpoint.url,
      swap: (next: Receiver) => {
        current = next;
      },
    };
  }

  beforeAll(() => {
    applied.length = 0;
  });
  afterAll(async () => {
    await Promise.all(endpoints.map((endpoint) => endpoint.close()));
    for (const table of tables) await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
    const keys = await redis.keys(`${prefix}*`);
    if (keys.length > 0) await redis.del(...keys);
    redis.disconnect();
  });

  it('receiver first: it trusts [new, old], the sender then switches; a retry signed with the new secret of an event applied under the old one is a duplicate', {
    timeout: 20_000,
  }, async () => {
    const oldSecret = hmac();
    const newSecret = hmac();
    const live = await liveEndpoint(receiverWith(oldSecret));
    const oldSender = createSender({ secret: oldSecret, timeout: '5s' });
    const newSender = createSender({ secret: newSecret, timeout: '5s' });

    expect((await oldSender.send({ id: 'rf_1', url: live.url, body: body(1) })).outcome).toBe('delivered');
    // Step 1: the receiver trusts both (new first), deployed while the sender still signs with old.
    live.swap(receiverWith([newSecret, oldSecret]));
    expect((await oldSender.send({ id: 'rf_2', url: live.url, body: body(2) })).outcome).toBe('delivered');
    // Step 2: the sender switches to new.
    expect((await newSender.send({ id: 'rf_3', url: live.url, body: body(3) })).outcome).toBe('delivered');
    // A retry of rf_1 (its acknowledgement lost before the rotation) now comes signed with new: it is
    // acknowledged without a second effect, since ids are recorded by webhook-id, not by signature.
    const retry = await newSender.send({ id: 'rf_1', url: live.url, body: body(1) });
    expect(retry.outcome).toBe('delivered');
    // Step 3: the receiver drops old. A delivery still signed with it (a sender not rotated) is refused.
    live.swap(receiverWith(newSecret));
    expect((await newSender.send({ id: 'rf_4', url: live.url, body: body(4) })).outcome).toBe('delivered');
    const stale = await oldSender.attempt({ id: 'rf_5', url: live.url, body: body(5) }, 1);
    expect(stale.status).toBe(400);
    expect(applied.filter((id) => id.startsWith('rf_')).sort()).toEqual(['rf_1', 'rf_2', 'rf_3', 'rf_4']);
  });

  it('sender first: signing with [new, old] is accepted by receivers on old only and on new only', async () => {
    const oldSecret = hmac();
    const newSecret = hmac();
    const both = createSigner({ secret: [newSecret, oldSecret] });
    const headers = both.sign({ id: 'sf_1', body: body(1), timestamp: new Date() });
    expect(headers['webhook-signature'].split(' ')).toHaveLength(2);
    for (const [index, trusted] of [oldSecret, newSecret, [newSecret, oldSecret]].entries()) {
      const receiver = createReceiver({
        store,
        secret: trusted,
        scope: `sf-${index}`,
        apply: () => undefined,
        onWarning: () => undefined,
      });
      const result = await receiver.handle({ headers, body: body(1) });
      expect(result.outcome).toBe('applied');
    }
  });

  it('Ed25519 (v1a): the sender rotates whsk_ keys, signing with both while receivers hold either public key; a v1 to v1a migration passes too', async () => {
    const oldPair = ed25519();
    const newPair = ed25519();
    const v1 = hmac();
    const cases: Array<{ sign: string[]; trust: string[] }> = [
      { sign: [newPair.privateKey, oldPair.privateKey], trust: [oldPair.publicKey] },
      { sign: [newPair.privateKey, oldPair.privateKey], trust: [newPair.publicKey] },
      { sign: [newPair.privateKey], trust: [newPair.publicKey, oldPair.publicKey] },
      { sign: [oldPair.privateKey], trust: [newPair.publicKey, oldPair.publicKey] },
      // Migrating from v1 to v1a: the sender signs with both schemes; old receivers keep their
      // whsec_, new ones hold only the public key.
      { sign: [v1, newPair.privateKey], trust: [v1] },
      { sign: [v1, newPair.privateKey], trust: [newPair.publicKey] },
    ];
    for (const [index, { sign, trust }] of cases.entries()) {
      const receiver = createReceiver({
        store,
        secret: trust,
        scope: `ed-${index}`,
        apply: () => undefined,
        onWarning: () => undefined,
      });
      const headers = createSigner({ secret: sign }).sign({
        id: `ed_${index}`,
        body: body(index),
        timestamp: new Date(),
      });
      const result = await receiver.handle({ headers, body: body(index) });
      expect(result.outcome, `case ${index}`).toBe('applied');
    }
    // Once the old key is dropped on both sides, a delivery signed by it alone is refused.
    const receiver = createReceiver({
      store,
      secret: newPair.publicKey,
      scope: 'ed-done',
      apply: () => undefined,
      onWarning: () => undefined,
    });
    const headers = createSigner({ secret: oldPair.privateKey }).sign({
      id: 'ed_x',
      body: body(0),
      timestamp: new Date(),
    });
    expect((await receiver.handle({ headers, body: body(0) })).outcome).toBe('rejected');
  });

  it('events queued in the outbox before the rotation are signed when sent: a relay restarted on the new secret delivers them to a receiver trusting [new, old]', {
    timeout: 30_000,
  }, async () => {
    const table = uniqueTable('rotation');
    tables.push(table);
    const outbox = createOutbox({ table });
    await outbox.migrate(pool);
    const oldSecret = hmac();
    const newSecret = hmac();
    const live = await liveEndpoint(receiverWith(oldSecret));
    for (let n = 1; n <= 3; n++) await outbox.add(pool, { id: `ob_${n}`, url: live.url, body: body(n) });

    // The rotation happens while they wait: receiver to [new, old], relay restarted on new.
    live.swap(receiverWith([newSecret, oldSecret]));
    const relay = outbox.relay({ db: pool, sender: createSender({ secret: newSecret, timeout: '5s' }) });
    const round = await relay.runOnce();
    expect(round.delivered).toBe(3);
    expect(applied.filter((id) => id.startsWith('ob_')).sort()).toEqual(['ob_1', 'ob_2', 'ob_3']);
  });

  it('sender rotated before the receiver: the refused deliveries are retried and land once the receiver trusts the new secret, each applied once', {
    timeout: 30_000,
  }, async () => {
    const table = uniqueTable('rotation');
    tables.push(table);
    const outbox = createOutbox({ table });
    await outbox.migrate(pool);
    const oldSecret = hmac();
    const newSecret = hmac();
    const live = await liveEndpoint(receiverWith(oldSecret));
    for (let n = 1; n <= 3; n++) await outbox.add(pool, { id: `wo_${n}`, url: live.url, body: body(n) });

    // The wrong order: the relay signs with new only while the receiver still trusts old only.
    const relay = outbox.relay({ db: pool, sender: createSender({ secret: newSecret, timeout: '5s' }) });
    const refused = await relay.runOnce();
    expect(refused.delivered).toBe(0);
    expect(refused.retrying).toBe(3);
    const pending = await pool.query(`SELECT id, status, last_attempt FROM "${table}" ORDER BY id`);
    expect(pending.rows.map((row) => row.status)).toEqual(['pending', 'pending', 'pending']);
    expect(pending.rows.every((row) => row.last_attempt?.status === 400)).toBe(true);

    // The receiver is rotated; the retries fall due (moved into the past instead of waited for).
    live.swap(receiverWith([newSecret, oldSecret]));
    await pool.query(`UPDATE "${table}" SET next_attempt_at = now() WHERE status = 'pending'`);
    const landed = await relay.runOnce();
    expect(landed.delivered).toBe(3);
    expect(applied.filter((id) => id.startsWith('wo_')).sort()).toEqual(['wo_1', 'wo_2', 'wo_3']);
  });
});
