import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { freePort } from './redis-env.js';
import { type RedisServerProcess, startRedisServer } from './redis-server.js';

/** The name the sentinels monitor the primary under. */
export const MASTER_NAME = 'idem-failover';

/**
 * A primary, its replicas and three Sentinels, all started by this test process on loopback ports
 * (never the shared Redis). Sentinel rewrites its config file, so each one gets a file in a
 * scratch directory that `stop()` removes.
 */
export interface SentinelSetup {
  /** Every data node, the primary first as started; after a failover the roles have moved. */
  readonly nodes: readonly RedisServerProcess[];
  /** Where the sentinels listen: what `new Redis({ sentinels, name })` takes. */
  readonly sentinels: readonly { host: string; port: number }[];
  /** The port of the node the sentinels call the primary now. */
  primaryPort(): Promise<number>;
  /** Waits until the sentinels name another primary than `port` and it accepts writes. */
  switchedFrom(port: number, timeoutMs?: number): Promise<number>;
  /** Sends `SENTINEL FAILOVER` (a planned switch) and resolves with the new primary's port once it takes writes. */
  failover(): Promise<number>;
  /** Waits until the node on `port` reports `role` (`'master'` or `'slave'`). */
  hasRole(port: number, role: 'master' | 'slave', timeoutMs?: number): Promise<void>;
  /** Waits until the primary has `count` replicas online with their link up. */
  replicasInSync(count: number, timeoutMs?: number): Promise<void>;
  stop(): Promise<void>;
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

// Readiness, not a TTL: poll a condition until it holds.
async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`sentinel setup: ${what} did not happen in ${timeoutMs} ms`);
    await pause(50);
  }
}

const admin = (port: number) => {
  const client = new Redis(port, '127.0.0.1', {
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
  });
  client.on('error', () => undefined);
  return client;
};

async function ask<T>(port: number, ...args: string[]): Promise<T> {
  const client = admin(port);
  try {
    await client.connect();
    return (await client.call(...(args as [string, ...string[]]))) as T;
  } finally {
    client.disconnect();
  }
}

/**
 * Starts a primary with `replicas` replicas (no persistence) and three Sentinels with a quorum of
 * two and `downAfterMs` before a silent primary counts as down. Resolves once the replicas are in
 * sync and every sentinel knows the replicas and the other sentinels, so a failover can start at once.
 */
export async function startSentinelSetup({ replicas = 1, downAfterMs = 1_000 } = {}): Promise<SentinelSetup> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-sentinel-'));
  const nodes: RedisServerProcess[] = [];
  const sentinelChildren: ChildProcess[] = [];
  const sentinels: { host: string; port: number }[] = [];
  const stop = async () => {
    for (const child of sentinelChildren) child.kill('SIGKILL');
    await Promise.all(nodes.map((node) => node.stop({ hard: true })));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    // Any node may become the primary; without the delay a replica's first sync waits 5 s.
    // A replica writes the RDB it receives to its directory: the scratch one, not the working tree.
    const quickSync = ['--repl-diskless-sync-delay', '0', '--dir', dir];
    const primary = await startRedisServer(0, quickSync);
    nodes.push(primary);
    for (let i = 0; i < replicas; i++) {
      nodes.push(await startRedisServer(0, [...quickSync, '--replicaof', '127.0.0.1', String(primary.port)]));
    }
    for (let i = 0; i < 3; i++) {
      const port = await freePort();
      const file = join(dir, `sentinel-${port}.conf`);
      writeFileSync(
        file,
        [
          `port ${port}`,
          'bind 127.0.0.1',
          `dir ${dir}`,
          `sentinel monitor ${MASTER_NAME} 127.0.0.1 ${primary.port} 2`,
          `sentinel down-after-milliseconds ${MASTER_NAME} ${downAfterMs}`,
          `sentinel failover-timeout ${MASTER_NAME} 10000`,
          '',
        ].join('\n'),
      );
      sentinelChildren.push(spawn('redis-server', [file, '--sentinel'], { stdio: 'ignore' }));
      sentinels.push({ host: '127.0.0.1', port });
    }
    const setup: SentinelSetup = {
      nodes,
      sentinels,
      primaryPort: async () => {
        const [, port] = await ask<string[]>(sentinels[0]!.port, 'SENTINEL', 'GET-MASTER-ADDR-BY-NAME', MASTER_NAME);
        return Number(port);
      },
      switchedFrom: (port, timeoutMs = 30_000) =>
        until('a new primary', timeoutMs, async () => {
          const now = await setup.primaryPort();
          if (now === port) return undefined;
          const role = await ask<[string]>(now, 'ROLE');
          return role[0] === 'master' ? now : undefined;
        }),
      failover: async () => {
        const before = await setup.primaryPort();
        await ask(sentinels[0]!.port, 'SENTINEL', 'FAILOVER', MASTER_NAME);
        return setup.switchedFrom(before);
      },
      hasRole: (port, role, timeoutMs = 60_000) =>
        until(`the node on ${port} to be a ${role}`, timeoutMs, async () => {
          const [now] = await ask<[string]>(port, 'ROLE');
          return now === role ? true : undefined;
        }).then(() => undefined),
      replicasInSync: (count, timeoutMs = 30_000) =>
        until(`${count} replicas in sync`, timeoutMs, async () => {
          const info = await ask<string>(await setup.primaryPort(), 'INFO', 'replication');
          const online = info.split('\n').filter((line) => /^slave\d+:.*state=online/.test(line)).length;
          return online >= count ? true : undefined;
        }).then(() => undefined),
      stop,
    };
    await setup.replicasInSync(replicas);
    // SENTINEL FAILOVER needs a replica the sentinel knows; an election needs the other sentinels.
    for (const sentinel of sentinels) {
      await until('sentinels to know each other and the replicas', 30_000, async () => {
        const known = await ask<unknown[]>(sentinel.port, 'SENTINEL', 'REPLICAS', MASTER_NAME);
        const peers = await ask<unknown[]>(sentinel.port, 'SENTINEL', 'SENTINELS', MASTER_NAME);
        return known.length >= replicas && peers.length >= 2 ? true : undefined;
      });
    }
    return setup;
  } catch (error) {
    await stop();
    throw error;
  }
}
