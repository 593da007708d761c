import { Redis } from 'ioredis';
import { type RedisServerProcess, startRedisServer } from './redis-server.js';

/** A primary and one replica of it, each a redis-server of this test process (see startRedisServer). */
export interface ReplicatedRedis {
  readonly primary: RedisServerProcess;
  readonly replica: RedisServerProcess;
  /** Stops both (SIGKILL when `hard`) and waits until they have exited. */
  stop(options?: { hard?: boolean }): Promise<void>;
}

/**
 * Starts a primary and a replica of it on free ports, and resolves once the replica acknowledges the
 * primary's writes (`WAIT 1` counts it), so its initial sync is over: a test that ran during the
 * sync met a `WAIT` that counted no replica. Readiness is polled, never waited out.
 *
 * @example
 * const { primary, replica, stop } = await startReplicatedRedis();
 */
export async function startReplicatedRedis(extraArgs: readonly string[] = []): Promise<ReplicatedRedis> {
  const primary = await startRedisServer(0, extraArgs);
  let replica: RedisServerProcess;
  try {
    replica = await startRedisServer(0, [...extraArgs, '--replicaof', '127.0.0.1', String(primary.port)]);
  } catch (error) {
    await primary.stop({ hard: true });
    throw error;
  }
  const stop = async (options?: { hard?: boolean }) => {
    await Promise.all([replica.stop(options), primary.stop(options)]);
  };
  const probe = new Redis(primary.url);
  try {
    const deadline = Date.now() + 10_000;
    while ((await probe.wait(1, 100)) < 1) {
      if (Date.now() > deadline) throw new Error('the replica did not sync within 10 s');
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  } catch (error) {
    await stop({ hard: true });
    throw error;
  } finally {
    probe.disconnect();
  }
  return { primary, replica, stop };
}
