import { execFile } from 'node:child_process';
import net from 'node:net';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import type { Redis } from 'ioredis';

/** The shared Redis the integration tests use. */
export const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

const hasCommand = (command: string) =>
  new Promise<boolean>((resolve) => execFile(command, ['--version'], (error) => resolve(!error)));

const skipped = 'these @idem/redis integration tests';

/** True when the Redis at REDIS_URL answers. */
export const redisAvailable = async () =>
  serviceAvailable(`Redis at ${redisUrl}`, await redisAnswers(redisUrl), skipped);

/** True when redis-server and redis-cli are installed (the cluster and outage tests start their own servers). */
export const redisBinariesAvailable = async () =>
  serviceAvailable(
    'redis-server/redis-cli',
    (await hasCommand('redis-server')) && (await hasCommand('redis-cli')),
    skipped,
  );

/** A TCP port nobody listens on right now (the OS picks it; ephemeral). */
export const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port')),
      );
    });
  });

/** Deletes every key under `prefix` on one Redis node (SCAN, never KEYS). */
export async function deleteKeys(client: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await client.unlink(...keys);
  } while (cursor !== '0');
}
