import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { freePort } from './redis-env.js';
import { type RedisServerProcess, startRedisServer } from './redis-server.js';

const run = promisify(execFile);

/** A throwaway Redis Cluster of three masters (and `replicas` replicas each) on loopback ports. */
export interface LocalRedisCluster {
  /** One `{ host, port }` per master, for ioredis `new Cluster(nodes)`. */
  readonly nodes: ReadonlyArray<{ host: string; port: number }>;
  /** `redis://127.0.0.1:port` per master, for node-redis `createCluster({ rootNodes })`. */
  readonly urls: readonly string[];
  /** Every server, masters and replicas, in the order they were started. */
  readonly servers: readonly RedisServerProcess[];
  /** Kills the servers and removes their directory. */
  stop(): Promise<void>;
}

// A cluster node also listens on port + 10000 (the cluster bus), so both must be free and valid.
const clusterPort = async (taken: Set<number>): Promise<number> => {
  for (;;) {
    const port = await freePort();
    if (port + 10_000 > 65_535 || taken.has(port) || taken.has(port + 10_000)) continue;
    return port;
  }
};

const clusterOk = async (port: number) => {
  const { stdout } = await run('redis-cli', ['-p', String(port), 'cluster', 'info']);
  return /cluster_state:ok/.test(stdout);
};

// The servers that are masters, by each one's own view (redis-cli --cluster create chooses them).
const mastersOf = async (servers: readonly RedisServerProcess[]) => {
  const roles = await Promise.all(
    servers.map(async (server) => {
      const { stdout } = await run('redis-cli', ['-p', String(server.port), 'role']);
      return stdout.startsWith('master');
    }),
  );
  return servers.filter((_, i) => roles[i]);
};

/**
 * Starts a real 3-master Redis Cluster (no persistence; `replicas` per master, none by default) in a temporary directory and
 * resolves once every node reports `cluster_state:ok`. Call `stop()` in `afterAll`.
 *
 * @example
 * const cluster = await startRedisCluster();
 * const client = new Cluster(cluster.nodes);
 * // ...
 * await client.quit();
 * await cluster.stop();
 */
export async function startRedisCluster({ replicas = 0 }: { replicas?: number } = {}): Promise<LocalRedisCluster> {
  const dir = await mkdtemp(path.join(tmpdir(), 'idem-redis-cluster-'));
  const servers: RedisServerProcess[] = [];
  const stop = async () => {
    await Promise.all(servers.map((server) => server.stop({ hard: true })));
    await rm(dir, { recursive: true, force: true });
  };
  try {
    const taken = new Set<number>();
    let failures = 0;
    const total = 3 * (1 + replicas);
    while (servers.length < total) {
      const port = await clusterPort(taken);
      taken.add(port);
      taken.add(port + 10_000);
      try {
        servers.push(
          await startRedisServer(port, [
            '--cluster-enabled',
            'yes',
            '--cluster-config-file',
            path.join(dir, `nodes-${port}.conf`),
            '--cluster-node-timeout',
            '5000',
            '--dir',
            dir,
          ]),
        );
      } catch (error) {
        // Someone took the port (or its bus port) between the check and the start: pick another.
        if (++failures >= 5) throw error;
      }
    }
    await run('redis-cli', [
      '--cluster',
      'create',
      ...servers.map((s) => `127.0.0.1:${s.port}`),
      '--cluster-replicas',
      String(replicas),
      '--cluster-yes',
    ]);
    const deadline = Date.now() + 30_000;
    for (;;) {
      const states = await Promise.all(servers.map((server) => clusterOk(server.port)));
      if (states.every(Boolean)) break;
      if (Date.now() > deadline) throw new Error('the local Redis Cluster did not reach cluster_state:ok');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    // With replicas, ready once each master has its replicas online (they sync after the slots are set).
    const masters = replicas === 0 ? servers : await mastersOf(servers);
    if (replicas > 0) {
      for (;;) {
        const online = await Promise.all(
          masters.map(async (master) => {
            const { stdout } = await run('redis-cli', ['-p', String(master.port), 'info', 'replication']);
            return (stdout.match(/^slave\d+:.*state=online/gm) ?? []).length >= replicas;
          }),
        );
        if (online.every(Boolean)) break;
        if (Date.now() > deadline) throw new Error('the local Redis Cluster replicas did not come online');
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
    return {
      nodes: masters.map((server) => ({ host: '127.0.0.1', port: server.port })),
      urls: masters.map((server) => server.url),
      servers,
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
