// The Redis Cluster harness itself (cluster.ts): what a case finds after the one before it changed
// the cluster. replica-wait.int.test.ts stops a replica in one case and counts on the masters it
// started with in the next; once in CI the next saw its records on 2 of its 3 masters.
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import { Cluster, Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { startRedisCluster } from './cluster.js';
import { redisBinariesAvailable } from './redis-env.js';

const run = promisify(execFile);
const withBinaries = await redisBinariesAvailable();

const role = async (port: number) => (await run('redis-cli', ['-p', String(port), 'role'])).stdout.split('\n')[0];

describe.runIf(withBinaries)('the Redis Cluster harness', () => {
  it('healthy() fails a promoted replica back: the next case finds the masters it started with, each owning records', async () => {
    const cluster = await startRedisCluster({ replicas: 1 });
    const client = new Cluster([...cluster.nodes]);
    const masters = cluster.nodes.map((node) => new Redis(node.port, node.host));
    try {
      const replica = cluster.servers.find((server) => !cluster.nodes.some((node) => node.port === server.port));
      expect(replica).toBeDefined();
      // What a case might leave behind: one master's replica took over its slots.
      await run('redis-cli', ['-p', String(replica!.port), 'cluster', 'failover']);
      const deadline = Date.now() + 20_000;
      while ((await role(replica!.port)) !== 'master') {
        if (Date.now() > deadline) throw new Error('the replica never took over');
        await new Promise((resolve) => setTimeout(resolve, 50));
      }

      await cluster.healthy();

      expect(await Promise.all(cluster.nodes.map((node) => role(node.port)))).toEqual(['master', 'master', 'master']);
      expect(await role(replica!.port)).toBe('slave');
      // The replica-wait precondition: records spread by key are on every one of the masters.
      const keys = Array.from({ length: 48 }, () => `audit-flakes:cluster:${randomUUID()}`);
      for (const key of keys) await client.set(key, '1', 'PX', 60_000);
      const owners = await Promise.all(
        keys.map(async (key) =>
          (await Promise.all(masters.map((master) => master.exists(key).catch(() => 0)))).indexOf(1),
        ),
      );
      expect(new Set(owners), `owners ${owners.join(',')}`).toEqual(new Set([0, 1, 2]));
    } finally {
      client.disconnect();
      for (const master of masters) master.disconnect();
      await cluster.stop();
    }
  }, 90_000);
});
