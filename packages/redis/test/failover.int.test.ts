// The store behind Redis Sentinel: what requests and their retries see when the primary is
// replaced. Every server here is started by this file on loopback ports, never the shared Redis.
import { randomUUID } from 'node:crypto';
import { createIdempotency } from '@idem/core';
import { createSentinel } from 'redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { redisStore } from '../src/index.js';
import { redisBinariesAvailable } from './redis-env.js';
import { MASTER_NAME, type SentinelSetup, startSentinelSetup } from './sentinel.js';

const withBinaries = await redisBinariesAvailable();

const claimOf = (id: string) => ({ id, token: randomUUID(), fingerprint: 'fp', leaseMs: 10_000 });
const outcome = { status: 201, headers: { 'content-type': 'application/json' }, body: new Uint8Array([123, 125]) };

describe.runIf(withBinaries)('node-redis Sentinel client (createSentinel)', () => {
  let setup: SentinelSetup;
  let sentinel: ReturnType<typeof createSentinel>;

  beforeAll(async () => {
    setup = await startSentinelSetup();
    sentinel = createSentinel({ name: MASTER_NAME, sentinelRootNodes: [...setup.sentinels] });
    sentinel.on('error', () => undefined);
    await sentinel.connect();
  });
  afterAll(async () => {
    sentinel?.destroy();
    await setup?.stop();
  });

  // Was wrong: a RedisSentinel's sendCommand takes `isReadonly` first (sendCommand(isReadonly, args,
  // options)), so the runner, which took it for a plain client, sent the options object as the
  // command: every call failed with "ERR Protocol error" and every request got 503.
  it('claims, completes and reads back a record through the sentinel-discovered primary', async () => {
    const store = redisStore({ client: sentinel, prefix: 'failover:' });
    const claim = claimOf(randomUUID());
    expect(await store.claim(claim)).toEqual({ claimed: true });
    expect(await store.complete({ ...claim, response: outcome, retentionMs: 60_000 })).toBe(true);
    expect(await store.get(claim.id)).toMatchObject({ state: 'completed', response: { status: 201 } });
  });

  it('serves the engine again after a SENTINEL FAILOVER, and replays what it stored before', async () => {
    const engine = createIdempotency({
      store: redisStore({ client: sentinel, prefix: 'failover:' }),
      storeTimeout: '1s',
    });
    const request = { key: randomUUID(), scope: 'user:1', operation: 'POST /orders', fingerprint: 'fp' };
    const first = await engine.begin(request);
    expect(first.kind).toBe('execute');
    if (first.kind !== 'execute') return;
    expect((await engine.complete(first.lease, outcome)).ok).toBe(true);
    // The record reached the replica before the switch (WAIT on the connection that wrote it), so
    // the failover cannot lose it: this checks the client follows the switch, not replication.
    expect(await sentinel.sendCommand(false, ['WAIT', '1', '5000'])).toBe(1);
    await setup.failover();
    // node-redis follows the switch on its own; a request may see 503 while it does, never a wrong answer.
    const deadline = Date.now() + 20_000;
    let retry = await engine.begin(request);
    while (retry.kind === 'reject' && retry.error.code === 'store_unavailable' && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      retry = await engine.begin(request);
    }
    expect(retry.kind).toBe('replay');
  });
});
