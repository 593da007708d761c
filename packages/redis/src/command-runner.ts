/**
 * The one thing the store needs from a Redis client: send a command that touches one `key` and get
 * the raw reply, with bulk strings as `Buffer` (records hold bytes). Integers may come as numbers, or
 * as their digits in a string or bytes (ioredis with `stringNumbers: true`): the store reads them all.
 *
 * {@link redisStore} builds one from an ioredis `Redis` or `Cluster`, or a node-redis client or
 * cluster, so most callers never see this type. Implement it yourself to use any other client
 * (`key` is there so a cluster client can route the command to the key's slot).
 *
 * @example
 * const runner: RedisCommandRunner = {
 *   send: (key, args) => myClient.rawCommand(args, { returnBuffers: true }),
 * };
 * const store = redisStore({ client: runner });
 */
export interface RedisCommandRunner {
  send(key: string, args: readonly (string | Buffer)[]): Promise<unknown>;
}

/**
 * The part of an ioredis `Redis` or `Cluster` the store uses.
 *
 * @example
 * import { Redis } from 'ioredis';
 * const store = redisStore({ client: new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379') }); // or new Cluster(nodes)
 */
export interface IoredisLike {
  callBuffer(command: string, ...args: (string | Buffer | number)[]): Promise<unknown>;
}

/**
 * The part of a node-redis v5 or v6 client the store uses.
 *
 * @example
 * import { createClient } from 'redis';
 * const store = redisStore({ client: await createClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' }).connect() });
 */
export interface NodeRedisClientLike {
  sendCommand(args: (string | Buffer)[], options?: object): Promise<unknown>;
}

/**
 * The part of a node-redis v5 or v6 cluster the store uses.
 *
 * @example
 * import { createCluster } from 'redis';
 * const cluster = await createCluster({ rootNodes: [{ url: 'redis://10.0.0.1:6379' }] }).connect();
 * const store = redisStore({ client: cluster });
 */
export interface NodeRedisClusterLike {
  sendCommand(
    firstKey: string | Buffer | undefined,
    isReadonly: boolean | undefined,
    args: (string | Buffer)[],
    options?: object,
  ): Promise<unknown>;
  readonly masters: readonly unknown[];
}

/**
 * The part of a node-redis v5 or v6 Sentinel client (`createSentinel`) the store uses. Its
 * `sendCommand` takes `isReadonly` first: the store passes `false`, so every command goes to the
 * primary the sentinels name (a replica lags it, see docs/stores.md).
 *
 * @example
 * import { createSentinel } from 'redis';
 * const sentinel = await createSentinel({ name: 'mymaster', sentinelRootNodes: [{ host: '10.0.0.1', port: 26379 }] }).connect();
 * const store = redisStore({ client: sentinel });
 */
export interface NodeRedisSentinelLike {
  sendCommand(isReadonly: boolean | undefined, args: (string | Buffer)[], options?: object): Promise<unknown>;
  getMasterNode(): unknown;
}

/**
 * Every client {@link redisStore} accepts.
 *
 * @example
 * const fromEnv = (client: RedisClientLike) => redisStore({ client, prefix: `${process.env.SERVICE}:idem:` });
 */
export type RedisClientLike =
  | IoredisLike
  | NodeRedisClientLike
  | NodeRedisClusterLike
  | NodeRedisSentinelLike
  | RedisCommandRunner;

// node-redis (v5 and v6) maps RESP types through `typeMapping`; 36 is '$', the blob (bulk) string. Spelled
// as a number so this package never imports `redis` at runtime (it is an optional peer).
const nodeRedisBuffers = { typeMapping: { 36: Buffer } };

/**
 * Wraps any supported client in a {@link RedisCommandRunner}. The caller keeps owning the client:
 * nothing here connects, quits or listens to it.
 *
 * @example
 * import { Redis } from 'ioredis';
 * const runner = redisCommandRunner(new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379'));
 * await runner.send('k', ['GET', 'k']); // Buffer or null
 */
export function redisCommandRunner(client: RedisClientLike): RedisCommandRunner {
  if (!client || (typeof client !== 'object' && typeof client !== 'function')) {
    throw new TypeError('client must be an ioredis or node-redis client, or a RedisCommandRunner');
  }
  const candidate = client as Partial<
    IoredisLike & NodeRedisClientLike & NodeRedisClusterLike & NodeRedisSentinelLike & RedisCommandRunner
  >;
  if (typeof candidate.send === 'function') return client as RedisCommandRunner;
  if (typeof candidate.callBuffer === 'function') return ioredisRunner(client as IoredisLike);
  if (typeof candidate.sendCommand === 'function') {
    // A node-redis cluster's sendCommand takes the routing key first; its `masters` list tells it apart.
    if (Array.isArray(candidate.masters)) {
      const cluster = client as NodeRedisClusterLike;
      return { send: (key, args) => cluster.sendCommand(key, false, [...args], nodeRedisBuffers) };
    }
    // A Sentinel client's sendCommand takes `isReadonly` first; taken for a plain client, it got the
    // options as the command and every call failed ("ERR Protocol error"). `getMasterNode` tells it apart.
    if (typeof candidate.getMasterNode === 'function') {
      const sentinel = client as NodeRedisSentinelLike;
      return { send: (_key, args) => sentinel.sendCommand(false, [...args], nodeRedisBuffers) };
    }
    const single = client as NodeRedisClientLike;
    return { send: (_key, args) => single.sendCommand([...args], nodeRedisBuffers) };
  }
  throw new TypeError('client must be an ioredis or node-redis client, or a RedisCommandRunner');
}

type IoredisMethod = (...args: (string | Buffer)[]) => Promise<unknown>;

/**
 * Sends through ioredis's own per-command Buffer methods (`setBuffer`, `evalshaBuffer`, ...), which
 * find each command's keys (Cluster routing, `keyPrefix`) and pass its name on in every mode.
 * `callBuffer` does neither everywhere: under `enableAutoPipelining` ioredis batches it without its
 * command name (Redis then answers "unknown command" to every call), and before ioredis 5.9 it finds
 * no keys for upper-case names, so `keyPrefix` was skipped and a Cluster redirected every command. It
 * stays the fallback for a client without the method.
 */
function ioredisRunner(ioredis: IoredisLike): RedisCommandRunner {
  const methods = new Map<string, IoredisMethod | undefined>();
  const methodOf = (command: string) => {
    if (!methods.has(command)) {
      const method = (ioredis as unknown as Record<string, unknown>)[`${command.toLowerCase()}Buffer`];
      methods.set(command, typeof method === 'function' ? (method.bind(ioredis) as IoredisMethod) : undefined);
    }
    return methods.get(command);
  };
  return {
    send: (_key, [command, ...args]) => {
      const method = methodOf(command as string);
      return method === undefined ? ioredis.callBuffer(command as string, ...args) : method(...args);
    },
  };
}
