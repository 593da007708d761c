// Review of waitForReplicas' proofs for a write sent again (a claim found held by its own token
// renews itself behind WAIT; a completion found done sets its expiry again): their cost when the
// option is off, and a Redis that has not loaded the changed scripts (a store upgraded in place).
// Against a primary and replica this file starts (never the shared Redis: SCRIPT FLUSH below).
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { StoredResponse } from '@idem/core';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { redisStore } from '../src/index.js';
import { completeScript, renewScript } from '../src/scripts.js';
import { redisBinariesAvailable } from './redis-env.js';
import { type RedisServerProcess, startRedisServer } from './redis-server.js';

const withBinaries = await redisBinariesAvailable();
const response = (body: Uint8Array): StoredResponse => ({ status: 201, headers: {}, body });

describe.runIf(withBinaries)('waitForReplicas: writes sent again, reviewed', () => {
  let primary: RedisServerProcess;
  let replica: RedisServerProcess;
  let scratch: string;
  let admin: Redis;
  let replicaAdmin: Redis;

  beforeAll(async () => {
    scratch = mkdtempSync(join(tmpdir(), 'idem-replica-review-'));
    primary = await startRedisServer(0, ['--dir', scratch]);
    replica = await startRedisServer(0, ['--dir', scratch, '--replicaof', '127.0.0.1', String(primary.port)]);
    admin = new Redis(primary.url);
    replicaAdmin = new Redis(replica.url);
    while ((await admin.wait(1, 100)) < 1) await new Promise((resolve) => setTimeout(resolve, 50));
  });
  afterAll(async () => {
    admin?.disconnect();
    replicaAdmin?.disconnect();
    await Promise.all([replica?.stop({ hard: true }), primary?.stop({ hard: true })]);
    if (scratch !== undefined) rmSync(scratch, { recursive: true, force: true });
  });

  const offset = async () => Number(/master_repl_offset:(\d+)/.exec(await admin.info('replication'))?.[1]);
  const calls = async (command: string) =>
    Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(await admin.info('commandstats'))?.[1] ?? 0);

  // The same claim sent twice (as ioredis resends a command whose reply was lost): the second finds
  // the key held by its own token.
  it('Held: off, a claim found held by its own token costs one GET and writes nothing (no renewal, no WAIT)', async () => {
    const client = new Redis(primary.url);
    try {
      const store = redisStore({ client, prefix: 'audit-review:off:' });
      const claim = { id: randomUUID(), token: 't1', fingerprint: '', leaseMs: 60_000 };
      expect(await store.claim(claim)).toEqual({ claimed: true });
      const [before, evals, waits] = [await offset(), await calls('evalsha'), await calls('wait')];
      expect(await store.claim(claim)).toEqual({ claimed: true });
      expect(await offset()).toBe(before);
      expect(await calls('evalsha')).toBe(evals);
      expect(await calls('wait')).toBe(waits);
    } finally {
      client.disconnect();
    }
  });

  it('Held: on, the claim found held by its own token renews itself behind a WAIT, fenced by its token', async () => {
    const client = new Redis(primary.url);
    try {
      const store = redisStore({
        client,
        prefix: 'audit-review:on:',
        waitForReplicas: { count: 1, timeout: '2s' },
      });
      const claim = { id: randomUUID(), token: 't1', fingerprint: '', leaseMs: 60_000 };
      expect(await store.claim(claim)).toEqual({ claimed: true });
      const [evals, waits] = [await calls('evalsha'), await calls('wait')];
      expect(await store.claim(claim)).toEqual({ claimed: true });
      // The renewal (the one script run) and a WAIT behind it. (WAIT's own GETACK moves the primary's
      // replication offset, so the offset says nothing here.)
      expect(await calls('evalsha')).toBe(evals + 1);
      expect(await calls('wait')).toBeGreaterThan(waits);
      // Another token is no renewal: it is answered with the holder, and runs no script.
      const other = await store.claim({ ...claim, token: 't2' });
      expect(other).toMatchObject({ claimed: false, record: { state: 'in_progress', token: 't1' } });
      expect(await calls('evalsha')).toBe(evals + 1);
    } finally {
      client.disconnect();
    }
  });

  // A store upgraded in place: the primary knows none of the scripts by their new SHA (SCRIPT FLUSH
  // stands for a Redis that only ever ran the old ones). EVALSHA's NOSCRIPT, inside the pipeline with
  // the WAIT, is the pipeline's error: the script goes again with EVAL, behind a WAIT of its own.
  it('Held: with the scripts unknown to Redis, a renewal and a completion sent twice still go through EVAL behind WAIT, and the replica has the outcome', async () => {
    const client = new Redis(primary.url);
    try {
      const store = redisStore({
        client,
        prefix: 'audit-review:noscript:',
        waitForReplicas: { count: 1, timeout: '2s' },
      });
      const id = randomUUID();
      const claim = { id, token: 't1', fingerprint: '', leaseMs: 60_000 };
      expect(await store.claim(claim)).toEqual({ claimed: true });
      await admin.script('FLUSH');
      expect(await admin.script('EXISTS', renewScript.sha, completeScript.sha)).toEqual([0, 0]);
      expect(await store.claim(claim)).toEqual({ claimed: true });
      const completion = { id, token: 't1', response: response(new Uint8Array([7])), retentionMs: 60_000 };
      expect(await store.complete(completion)).toBe(true);
      await admin.script('FLUSH');
      expect(await store.complete(completion)).toBe(true);
      // Read from the replica: it has the outcome, and what the primary keeps.
      expect(await replicaAdmin.getBuffer(store.key(id))).toEqual(await admin.getBuffer(store.key(id)));
      expect((await replicaAdmin.getBuffer(store.key(id)))?.[0]).toBe('c'.charCodeAt(0));
    } finally {
      client.disconnect();
    }
  });
});
