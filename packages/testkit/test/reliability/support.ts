// Shared by the reliability scenarios: where the real Redis and PostgreSQL are (loudly skipping, or
// failing under CI=true, when one does not answer), one store "backend" per run with unique names,
// the worker fixture, and a small HTTP client that records status, headers and time of each answer.

import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { recordId, type StoreRecord } from '@idem/core';
import { migrate, postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { Cluster, Redis } from 'ioredis';
import pg from 'pg';
import { startWorkers, type Workers } from '../../src/workers.js';

export const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
export const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
/** Long variants (10 s outages, 10 s of hot-key load) run only with IDEM_CHAOS=1. */
export const chaos = process.env.IDEM_CHAOS === '1';
export const workerScript = fileURLToPath(new URL('./fixtures/charge-worker.ts', import.meta.url));
export const scope = 'tenant-1';
export const operation = 'POST /charges';

const announce = (what: string, ok: boolean): boolean => {
  if (ok) return true;
  const message = `${what} is not reachable: these reliability scenarios are SKIPPED.`;
  if (process.env.CI === 'true') throw new Error(`CI=true and ${message}`);
  console.warn(`\n!!! ${message}\n`);
  return false;
};

/** True when Redis at REDIS_URL answers. */
export async function redisAvailable(): Promise<boolean> {
  const client = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: 1500 });
  client.on('error', () => undefined);
  let ok = false;
  try {
    await client.connect();
    ok = (await client.ping()) === 'PONG';
  } catch {
    ok = false;
  } finally {
    client.disconnect();
  }
  return announce(`Redis at ${redisUrl}`, ok);
}

/** True when PostgreSQL at DATABASE_URL answers. */
export async function postgresAvailable(): Promise<boolean> {
  const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: 2000 });
  client.on('error', () => undefined);
  let ok = false;
  try {
    await client.connect();
    await client.query('SELECT 1');
    ok = true;
  } catch {
    ok = false;
  } finally {
    await client.end().catch(() => undefined);
  }
  return announce(`PostgreSQL at ${databaseUrl}`, ok);
}

const hasCommand = (command: string) =>
  new Promise<boolean>((resolve) => execFile(command, ['--version'], (error) => resolve(!error)));

/** True when redis-server and redis-cli are installed, so a test can start its own Redis Cluster. */
export async function redisClusterAvailable(): Promise<boolean> {
  const ok = (await hasCommand('redis-server')) && (await hasCommand('redis-cli'));
  return announce('redis-server/redis-cli (for a local Redis Cluster)', ok);
}

/** Which store a scenario runs on: Redis, PostgreSQL, or PostgreSQL with transactional mode. */
export type BackendKind = 'redis' | 'postgres' | 'postgres-tx';
export const backendKinds: readonly BackendKind[] = ['redis', 'postgres', 'postgres-tx'];

/**
 * One store for one test file: unique Redis prefix or PostgreSQL tables, the env a worker needs to
 * use them, and the test's own view of records and effects (through a direct connection).
 */
export interface Backend {
  readonly kind: BackendKind | 'redis-cluster';
  readonly transactional: boolean;
  /** Host and port of the real server, for a proxy in front of it. */
  readonly target: { host: string; port: number };
  /** Worker env; `storeUrl` overrides where the worker connects (a proxy). */
  env(storeUrl?: string): Record<string, string>;
  /** URL with the host and port replaced (to point a worker at a proxy). */
  via(port: number): string;
  /** How many times the effect of `key` was applied. */
  effects(key: string): Promise<number>;
  /** Every effect applied, per key. */
  allEffects(): Promise<Map<string, number>>;
  /** The live record of `key`, read through the store itself. */
  record(key: string): Promise<StoreRecord | undefined>;
  /** Milliseconds the record of `key` has left by the store's clock, or undefined. */
  ttl(key: string): Promise<number | undefined>;
  /** Redis `INFO commandstats` total (Redis only). */
  commandCount(): Promise<number>;
  close(): Promise<void>;
}

const unique = (label: string) => `${label}_${randomBytes(4).toString('hex')}`;

/** Creates the backend of one kind for one test file. */
export async function createBackend(kind: BackendKind, label: string): Promise<Backend> {
  if (kind === 'redis') {
    const redis = new Redis(redisUrl);
    redis.on('error', () => undefined);
    const prefix = `idem-rel:${unique(label)}:`;
    const store = redisStore({ client: redis, prefix });
    const parsed = new URL(redisUrl);
    const effects = async (key: string) => Number((await redis.get(`${prefix}fx:${key}`)) ?? 0);
    return {
      kind,
      transactional: false,
      target: { host: parsed.hostname, port: Number(parsed.port || 6379) },
      env: (storeUrl = redisUrl) => ({ STORE: 'redis', STORE_URL: storeUrl, PREFIX: prefix }),
      via: (port) => {
        const next = new URL(redisUrl);
        next.hostname = '127.0.0.1';
        next.port = String(port);
        return next.toString();
      },
      effects,
      async allEffects() {
        const out = new Map<string, number>();
        let cursor = '0';
        do {
          const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}fx:*`, 'COUNT', 1000);
          cursor = next;
          for (const k of keys) out.set(k.slice(`${prefix}fx:`.length), Number(await redis.get(k)));
        } while (cursor !== '0');
        return out;
      },
      record: (key) => store.get(recordId(scope, operation, key)),
      async ttl(key) {
        const ms = await redis.pttl(store.key(recordId(scope, operation, key)));
        return ms < 0 ? undefined : ms;
      },
      async commandCount() {
        const info = await redis.info('commandstats');
        let total = 0;
        for (const match of info.matchAll(/calls=(\d+)/g)) total += Number(match[1]);
        return total;
      },
      async close() {
        let cursor = '0';
        do {
          const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
          cursor = next;
          if (keys.length > 0) await redis.unlink(...keys);
        } while (cursor !== '0');
        redis.disconnect();
      },
    };
  }
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
  pool.on('error', () => undefined);
  const table = `idem_rel_${unique(label)}`;
  const effectsTable = `${table}_fx`;
  await migrate(pool, { table });
  await pool.query(
    `CREATE TABLE "${effectsTable}" (n serial PRIMARY KEY, key text NOT NULL, execution text NOT NULL, worker int NOT NULL)`,
  );
  const store = postgresStore({ client: pool, table });
  const parsed = new URL(databaseUrl);
  return {
    kind,
    transactional: kind === 'postgres-tx',
    target: { host: parsed.hostname, port: Number(parsed.port || 5432) },
    env: (storeUrl = databaseUrl) => ({
      STORE: 'postgres',
      STORE_URL: storeUrl,
      TABLE: table,
      EFFECTS: effectsTable,
      TRANSACTIONAL: kind === 'postgres-tx' ? '1' : '0',
    }),
    via: (port) => {
      const next = new URL(databaseUrl);
      next.hostname = '127.0.0.1';
      next.port = String(port);
      return next.toString();
    },
    async effects(key) {
      const { rows } = await pool.query(`SELECT count(*)::int AS n FROM "${effectsTable}" WHERE key = $1`, [key]);
      return rows[0].n as number;
    },
    async allEffects() {
      const { rows } = await pool.query(`SELECT key, count(*)::int AS n FROM "${effectsTable}" GROUP BY key`);
      return new Map(rows.map((row) => [row.key as string, row.n as number]));
    },
    record: (key) => store.get(recordId(scope, operation, key)),
    async ttl(key) {
      const { rows } = await pool.query(
        `SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::float8 AS ms FROM "${table}" WHERE id = $1 AND expires_at > clock_timestamp()`,
        [recordId(scope, operation, key)],
      );
      return rows[0] === undefined ? undefined : Number(rows[0].ms);
    },
    commandCount: () => Promise.reject(new Error('commandCount is Redis only')),
    async close() {
      await pool.query(`DROP TABLE IF EXISTS "${effectsTable}"`);
      await pool.query(`DROP TABLE IF EXISTS "${table}"`);
      await pool.end();
    },
  };
}

/**
 * The backend on a Redis Cluster the test file started (`startRedisCluster()` of the Redis package's
 * tests): records through `redisStore()` on an ioredis `Cluster`, effects under the hash tag of their
 * key. The cluster belongs to this file alone, so `commandCount()` (summed over its masters) is exact.
 */
export async function createClusterBackend(
  nodes: ReadonlyArray<{ host: string; port: number }>,
  label: string,
): Promise<Backend> {
  const cluster = new Cluster([...nodes]);
  cluster.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    cluster.once('ready', () => resolve());
    cluster.once('end', () => reject(new Error('the test client could not reach the Redis Cluster')));
  });
  const prefix = `idem-rel:${unique(label)}:`;
  const store = redisStore({ client: cluster, prefix });
  const first = nodes[0];
  if (!first) throw new TypeError('createClusterBackend needs at least one node');
  const effects = async (key: string) => Number((await cluster.get(`${prefix}fx:{${key}}`)) ?? 0);
  return {
    kind: 'redis-cluster',
    transactional: false,
    target: first,
    env: () => ({ STORE: 'redis-cluster', CLUSTER_NODES: JSON.stringify(nodes), PREFIX: prefix }),
    via: () => {
      throw new Error('a proxy in front of a cluster would hide its MOVED redirections: not supported');
    },
    effects,
    async allEffects() {
      const out = new Map<string, number>();
      for (const node of cluster.nodes('master')) {
        let cursor = '0';
        do {
          const [next, keys] = await node.scan(cursor, 'MATCH', `${prefix}fx:*`, 'COUNT', 1000);
          cursor = next;
          for (const k of keys) out.set(k.slice(`${prefix}fx:{`.length, -1), Number(await node.get(k)));
        } while (cursor !== '0');
      }
      return out;
    },
    record: (key) => store.get(recordId(scope, operation, key)),
    async ttl(key) {
      const ms = await cluster.pttl(store.key(recordId(scope, operation, key)));
      return ms < 0 ? undefined : ms;
    },
    async commandCount() {
      let total = 0;
      for (const node of cluster.nodes('master')) {
        const info = await node.info('commandstats');
        for (const match of info.matchAll(/calls=(\d+)/g)) total += Number(match[1]);
      }
      return total;
    },
    async close() {
      // The cluster's servers are thrown away with their data; only the connection is ours to end.
      cluster.disconnect();
    },
  };
}

/** Starts `count` charge workers on `backend` (optionally through a proxy) with extra env. */
export function startChargeWorkers(
  backend: Backend,
  count: number,
  extra: Record<string, string> | ((index: number) => Record<string, string>) = {},
  storeUrl?: string,
): Promise<Workers> {
  return startWorkers({
    count,
    script: workerScript,
    readyTimeoutMs: 40_000,
    env: (index) => ({ ...backend.env(storeUrl), ...(typeof extra === 'function' ? extra(index) : extra) }),
  });
}

/** What one request got. `status` 0: the connection failed or the client gave up. */
export interface Answer {
  status: number;
  headers: Headers;
  body: string;
  ms: number;
}

/** POSTs a charge with `key`; never throws (a dropped connection is status 0). */
export async function charge(
  baseUrl: string,
  key: string,
  options: { killAt?: string; timeoutMs?: number; body?: string } = {},
): Promise<Answer> {
  const started = performance.now();
  const headers: Record<string, string> = { 'idempotency-key': key, 'content-type': 'application/json' };
  if (options.killAt) headers['x-kill-at'] = options.killAt;
  try {
    const response = await fetch(`${baseUrl}/charges`, {
      method: 'POST',
      headers,
      body: options.body ?? '{"amount":4200}',
      signal: AbortSignal.timeout(options.timeoutMs ?? 15_000),
    });
    const body = await response.text();
    return { status: response.status, headers: response.headers, body, ms: performance.now() - started };
  } catch {
    return { status: 0, headers: new Headers(), body: '', ms: performance.now() - started };
  }
}

/** The per-process counters a worker reports on GET /stats. */
export interface WorkerStats {
  worker: number;
  pid: number;
  ops: Record<string, number>;
  events: Record<string, number>;
}

export async function stats(baseUrl: string): Promise<WorkerStats> {
  // A fresh connection: after a load run, a pooled keep-alive socket may be the one the server is
  // closing at its keep-alive timeout, and the read would fail for a reason that is not the test's.
  const response = await fetch(`${baseUrl}/stats`, { headers: { connection: 'close' } });
  return (await response.json()) as WorkerStats;
}

export const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Retries `key` until it is no longer in progress (409) or `limitMs` passes; resolves to the last
 * answer and how long it took. Polls every 50 ms: this waits for the store's lease to end, it does
 * not sleep a fixed time.
 */
export async function retryUntilSettled(
  baseUrl: string,
  key: string,
  limitMs: number,
): Promise<{ answer: Answer; waitedMs: number; conflicts: number }> {
  const started = performance.now();
  let conflicts = 0;
  for (;;) {
    const answer = await charge(baseUrl, key);
    if ((answer.status !== 409 && answer.status !== 503) || performance.now() - started > limitMs)
      return { answer, waitedMs: performance.now() - started, conflicts };
    conflicts++;
    await pause(50);
  }
}

/** Prints one line of measured figures, for docs/reliability.md (run with `--reporter=verbose`). */
export function figures(scenario: string, data: Record<string, unknown>): void {
  console.info(`[figures] ${scenario} ${JSON.stringify(data)}`);
}

/**
 * Lets the scenarios of one file run at once without one's timing paying for another's start-up.
 * Each of `count` concurrent blocks wraps its `beforeAll` setup in the returned function; every setup
 * then waits until all of them have finished (or failed) before its block's tests begin. Starting
 * worker processes (Node, tsx) is the CPU-heavy part of a scenario; the scenarios themselves mostly
 * wait on leases, which is why they can overlap, but a lease of a few hundred milliseconds timed
 * while other processes compile would lose its margin.
 */
export function startTogether(count: number): <T>(setup: () => Promise<T>) => Promise<T> {
  let arrived = 0;
  let release!: () => void;
  const everyone = new Promise<void>((resolve) => {
    release = resolve;
  });
  return async (setup) => {
    try {
      return await setup();
    } finally {
      if (++arrived >= count) release();
      await everyone;
    }
  };
}
