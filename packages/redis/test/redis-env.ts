import { execFile } from 'node:child_process';
import net from 'node:net';
import { Redis } from 'ioredis';

/** The shared Redis the integration tests use. */
export const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

const ping = async (url: string): Promise<boolean> => {
  const client = new Redis(url, {
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    connectTimeout: 1500,
  });
  client.on('error', () => undefined);
  try {
    await client.connect();
    return (await client.ping()) === 'PONG';
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
};

const hasCommand = (command: string) =>
  new Promise<boolean>((resolve) => execFile(command, ['--version'], (error) => resolve(!error)));

/**
 * Says whether a service the tests need is there. When it is not, says so loudly; with CI=true it
 * throws, so CI can never pass by skipping.
 */
const announce = (what: string, available: boolean): boolean => {
  if (available) return true;
  const message = `${what} is not available: these @idem/redis integration tests are SKIPPED.`;
  if (process.env.CI === 'true') throw new Error(`CI=true and ${message}`);
  console.warn(`\n!!! ${message}\n`);
  return false;
};

/** True when the Redis at REDIS_URL answers. */
export const redisAvailable = async () => announce(`Redis at ${redisUrl}`, await ping(redisUrl));

/** True when redis-server and redis-cli are installed (the cluster and outage tests start their own servers). */
export const redisBinariesAvailable = async () =>
  announce('redis-server/redis-cli', (await hasCommand('redis-server')) && (await hasCommand('redis-cli')));

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
