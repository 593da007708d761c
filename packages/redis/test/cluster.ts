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
  /**
   * Resolves once the cluster is as it started, for a case that counts on its masters: every node
   * answers `cluster_state:ok` and flags no node failing, the masters of `nodes` own all the slots
   * again (a replica promoted meanwhile, by a failover a case caused, is failed back with CLUSTER
   * FAILOVER on its old master), and each master has its replicas online. Throws, with every
   * node's CLUSTER NODES, when that is not so within 30 s.
   */
  healthy(): Promise<void>;
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

const cli = async (port: number, ...args: string[]) => (await run('redis-cli', ['-p', String(port), ...args])).stdout;

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
    const healthy = async () => {
      const deadline = Date.now() + 30_000;
      let failedBackAt = 0;
      for (;;) {
        const state = await Promise.all(
          servers.map(async (server) => ({
            server,
            ok: await clusterOk(server.port).catch(() => false),
            // Flags of every node as this one sees it: "fail" or "fail?" (suspected) is a node down.
            failing: /^\S+ \S+ \S*fail/m.test(await cli(server.port, 'cluster', 'nodes').catch(() => 'x x fail')),
          })),
        );
        const roles = await Promise.all(
          masters.map(async (master) => (await cli(master.port, 'role').catch(() => '')).split('\n')[0]),
        );
        const online = await Promise.all(
          masters.map(async (master) => {
            const replication = await cli(master.port, 'info', 'replication').catch(() => '');
            return (replication.match(/^slave\d+:.*state=online/gm) ?? []).length >= replicas;
          }),
        );
        const settled = state.every((node) => node.ok && !node.failing);
        if (settled && roles.every((role) => role === 'master') && online.every(Boolean)) return;
        // A master that became a replica, its link to the one that took over up: take its slots back
        // (a coordinated failover: the promoted replica hands over once this one has caught up).
        if (settled && Date.now() - failedBackAt > 5_000) {
          const demoted = masters.filter((_, i) => roles[i] === 'slave');
          for (const master of demoted) {
            if (/master_link_status:up/.test(await cli(master.port, 'info', 'replication').catch(() => ''))) {
              await cli(master.port, 'cluster', 'failover').catch(() => undefined);
              failedBackAt = Date.now();
            }
          }
        }
        if (Date.now() > deadline) {
          const views = await Promise.all(
            servers.map(
              async (server) =>
                `${server.port}:\n${await cli(server.port, 'cluster', 'nodes').catch((error: unknown) => String(error))}`,
            ),
          );
          throw new Error(
            `the local Redis Cluster is not as it started (masters ${masters.map((m) => m.port).join(', ')}):\n${views.join('\n')}`,
          );
        }
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    };
    return {
      healthy,
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
