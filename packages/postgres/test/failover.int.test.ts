// The store when PostgreSQL's primary is replaced by its streaming standby (pg_ctl promote). The
// primary, the standby and the proxies are this file's own, on loopback ports; the shared server
// is never touched. pg takes one host per pool (no `host=a,b target_session_attrs=read-write`), so
// the application reaches the database through an endpoint that moves on failover: here a TCP
// proxy, in production a virtual IP, a DNS name, HAProxy or PgBouncer.
import { createIdempotency, type IdempotencyEngine, StoreUnavailableError } from '@idem/core';
import { createTcpProxy, type TcpProxy } from '@idem/testkit';
import pg from 'pg';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { migrate, postgresStore } from '../src/index.js';
import { freePort, type ReplicatedCluster, replicationAvailable, startReplicatedCluster } from './replication.js';

const available = await replicationAvailable();

const STORE_TIMEOUT_MS = 1_000;
const HANG_AFTER_MS = STORE_TIMEOUT_MS * 3 + 2_000;
const outcome = { status: 201, headers: { 'content-type': 'application/json' }, body: new Uint8Array([123, 125]) };
const request = (key: string) => ({ key, scope: 'user:1', operation: 'POST /orders', fingerprint: 'fp' });

const poolOn = (port: number, options: pg.PoolConfig = {}) => {
  const pool = new pg.Pool({
    host: '127.0.0.1',
    port,
    user: 'postgres',
    database: 'postgres',
    max: 8,
    connectionTimeoutMillis: 1_000,
    ...options,
  });
  // Idle connections die with the primary: the pool's owner listens (docs/stores.md).
  pool.on('error', () => undefined);
  return pool;
};

// A lease far longer than any run: the claims these tests leave behind (k-second) must read as held
// (in_progress) on the promoted standby however slow the box. With the default 10 s, a crash and
// promotion that took that long under CI load let the check take the abandoned claim over (execute),
// which read as if the unconfirmed outcome had reached the standby.
const LEASE = '10m';

const engineOn = (pool: pg.Pool) =>
  createIdempotency({ store: postgresStore({ client: pool }), storeTimeout: STORE_TIMEOUT_MS, lease: LEASE });

describe.runIf(available)('PostgreSQL failover: the standby promoted', () => {
  let cluster: ReplicatedCluster;
  const pools: pg.Pool[] = [];
  const pool = (port: number, options?: pg.PoolConfig) => {
    const made = poolOn(port, options);
    pools.push(made);
    return made;
  };

  beforeEach(async () => {
    cluster = await startReplicatedCluster(await freePort(), await freePort());
    const setup = pool(cluster.primaryPort);
    await migrate(setup);
    await cluster.caughtUp();
  });
  afterEach(async () => {
    // A connection still waiting for a synchronous standby never ends on its own: do not wait for it.
    for (const made of pools.splice(0)) void made.end().catch(() => undefined);
    await cluster?.stop();
  });

  it('holds: the primary crashes under load and the endpoint moves to the promoted standby: successes and 503s only, none hangs', async () => {
    let endpoint: TcpProxy = await createTcpProxy({ target: { host: '127.0.0.1', port: cluster.primaryPort } });
    const port = endpoint.port;
    const engine = engineOn(pool(port, { query_timeout: 2_000 }));
    const load = startLoad(engine);
    try {
      await load.until('100 stored outcomes before the crash', () => load.count('stored') >= 100);
      await cluster.crashPrimary();
      await load.until('some 503s while no primary answers', () => load.count('unavailable') >= 5);
      await cluster.promote();
      // The virtual IP moves: same address, the new primary behind it.
      await endpoint.close();
      endpoint = await createTcpProxy({ target: { host: '127.0.0.1', port: cluster.standbyPort }, port });
      const stored = load.count('stored');
      await load.until('100 stored outcomes on the promoted standby', () => load.count('stored') >= stored + 100);
    } finally {
      await load.stop();
      await endpoint.close();
    }
    expect(load.others()).toEqual([]);
  });

  // docs/stores.md, Durability: "With asynchronous streaming replication, a failover can lose the
  // last commits". The steps of the next test, without synchronous replication: the outcome the
  // primary acknowledged while the standby heard nothing is gone after the promotion, and its retry
  // would run again once the claim's lease ends. (What makes the next test mean something.)
  it('holds (as documented): asynchronous replication loses an outcome answered as stored', async () => {
    const { first, second } = await storeTwoThenFailOver(cluster, pool);
    expect(first).toBe('stored');
    expect(second).toBe('stored');
    const after = engineOn(pool(cluster.standbyPort));
    expect((await after.begin(request('k-first'))).kind).toBe('replay');
    const lost = await after.begin(request('k-second'));
    expect(lost.kind === 'reject' && lost.error.code).toBe('in_progress');
  });

  // docs/stores.md and docs/operations.md: "synchronous_standby_names closes that".
  it('holds: with synchronous_standby_names no outcome answered as stored is lost; one the standby could not confirm is a store error', async () => {
    await cluster.configurePrimary('synchronous_standby_names', '*');
    await cluster.streaming(true);
    const { first, second } = await storeTwoThenFailOver(cluster, pool);
    expect(first).toBe('stored');
    // The standby heard nothing: the commit waited for it until storeTimeout, and the engine said so.
    expect(second).toBe('store-error');
    const after = engineOn(pool(cluster.standbyPort));
    expect((await after.begin(request('k-first'))).kind).toBe('replay');
    const unconfirmed = await after.begin(request('k-second'));
    expect(unconfirmed.kind === 'reject' && unconfirmed.error.code).toBe('in_progress');
  });

  it('holds: a pool left on a standby (the endpoint not moved yet) gets 503, the read-only refusal (25006) as its cause', async () => {
    const engine = engineOn(pool(cluster.standbyPort));
    const refused = await engine.begin(request('k-standby'));
    expect(refused.kind === 'reject' && refused.error.code).toBe('store_unavailable');
    if (refused.kind !== 'reject') return;
    expect(causes(refused.error).find((cause) => cause instanceof StoreUnavailableError)).toBeDefined();
    expect(causes(refused.error).some((cause) => (cause as { code?: unknown }).code === '25006')).toBe(true);
  });
});

/** An error and every `cause` under it. */
const causes = (error: unknown): unknown[] =>
  error instanceof Error && error.cause !== undefined ? [error, ...causes(error.cause)] : [error];

/**
 * Stores k-first with the standby listening, claims k-second and lets the standby replay it,
 * silences the standby's link, completes k-second, then crashes the primary and promotes the standby. Returns what each completion said.
 */
async function storeTwoThenFailOver(cluster: ReplicatedCluster, pool: (port: number) => pg.Pool) {
  const engine = engineOn(pool(cluster.primaryPort));
  const settle = async (key: string, before?: () => Promise<void>) => {
    const started = await engine.begin(request(key));
    if (started.kind !== 'execute') throw new Error(`claim of ${key}: ${started.kind}`);
    await before?.();
    const completed = await engine.complete(started.lease, outcome);
    return completed.ok ? 'stored' : completed.reason;
  };
  const first = await settle('k-first');
  // The claim of k-second reaches the standby; then the primary keeps answering its clients, and
  // nothing more reaches the standby.
  const second = await settle('k-second', async () => {
    await cluster.caughtUp();
    cluster.link.blackhole();
  });
  await cluster.crashPrimary();
  cluster.link.cut();
  await cluster.promote();
  return { first, second };
}

type First = 'stored' | 'served-not-stored' | 'unavailable' | 'hang' | `other:${string}`;

/** Keeps request loops on the engine, each with a fresh key, and counts what each request saw. */
function startLoad(engine: IdempotencyEngine, loops = 6) {
  const seen: First[] = [];
  let stopped = false;
  let next = 0;
  const attempt = async (key: string): Promise<First> => {
    const started = await engine.begin(request(key));
    if (started.kind === 'reject')
      return started.error.code === 'store_unavailable' ? 'unavailable' : `other:${started.error.code}`;
    if (started.kind === 'replay') return 'other:replay';
    const completed = await engine.complete(started.lease, outcome);
    return completed.ok ? 'stored' : 'served-not-stored';
  };
  const loop = async () => {
    while (!stopped) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const hang = new Promise<First>((resolve) => {
        timer = setTimeout(() => resolve('hang'), HANG_AFTER_MS);
      });
      seen.push(
        await Promise.race([
          attempt(`k-${next++}`).catch((error: unknown) => `other:${String(error)}` as First),
          hang,
        ]).finally(() => clearTimeout(timer)),
      );
    }
  };
  const running = Promise.all(Array.from({ length: loops }, loop));
  const count = (what: First) => seen.filter((one) => one === what).length;
  return {
    count,
    others: () => seen.filter((one) => one.startsWith('other:') || one === 'hang'),
    async until(what: string, reached: () => boolean, timeoutMs = 60_000) {
      const deadline = Date.now() + timeoutMs;
      while (!reached()) {
        if (Date.now() > deadline) throw new Error(`load never reached: ${what}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    },
    async stop() {
      stopped = true;
      await running;
    },
  };
}
