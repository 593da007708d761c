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
 * const store = redisStore({ client: new Redis(process.env.REDIS_URL) }); // or new Cluster(nodes)
 */
export interface IoredisLike {
  callBuffer(command: string, ...args: (string | Buffer | number)[]): Promise<unknown>;
}

/**
 * The part of a node-redis v5 client the store uses.
 *
 * @example
 * const store = redisStore({ client: await createClient({ url: process.env.REDIS_URL }).connect() });
 */
export interface NodeRedisClientLike {
  sendCommand(args: (string | Buffer)[], options?: object): Promise<unknown>;
}

/**
 * The part of a node-redis v5 cluster the store uses.
 *
 * @example
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
 * Every client {@link redisStore} accepts.
 *
 * @example
 * const fromEnv = (client: RedisClientLike) => redisStore({ client, prefix: `${process.env.SERVICE}:idem:` });
 */
export type RedisClientLike = IoredisLike | NodeRedisClientLike | NodeRedisClusterLike | RedisCommandRunner;

// node-redis v5 maps RESP types through `typeMapping`; 36 is '$', the blob (bulk) string. Spelled
// as a number so this package never imports `redis` at runtime (it is an optional peer).
const nodeRedisBuffers = { typeMapping: { 36: Buffer } };

/**
 * Wraps any supported client in a {@link RedisCommandRunner}. The caller keeps owning the client:
 * nothing here connects, quits or listens to it.
 *
 * @example
 * import { Redis } from 'ioredis';
 * const runner = redisCommandRunner(new Redis(process.env.REDIS_URL));
 * await runner.send('k', ['GET', 'k']); // Buffer or null
 */
export function redisCommandRunner(client: RedisClientLike): RedisCommandRunner {
  if (!client || (typeof client !== 'object' && typeof client !== 'function')) {
    throw new TypeError('client must be an ioredis or node-redis client, or a RedisCommandRunner');
  }
  const candidate = client as Partial<IoredisLike & NodeRedisClientLike & NodeRedisClusterLike & RedisCommandRunner>;
  if (typeof candidate.send === 'function') return client as RedisCommandRunner;
  if (typeof candidate.callBuffer === 'function') {
    const ioredis = client as IoredisLike;
    // ioredis finds the key of EVAL/EVALSHA itself (for Cluster routing and keyPrefix).
    return { send: (_key, [command, ...args]) => ioredis.callBuffer(command as string, ...args) };
  }
  if (typeof candidate.sendCommand === 'function') {
    // A node-redis cluster's sendCommand takes the routing key first; its `masters` list tells it apart.
    if (Array.isArray(candidate.masters)) {
      const cluster = client as NodeRedisClusterLike;
      return { send: (key, args) => cluster.sendCommand(key, false, [...args], nodeRedisBuffers) };
    }
    const single = client as NodeRedisClientLike;
    return { send: (_key, args) => single.sendCommand([...args], nodeRedisBuffers) };
  }
  throw new TypeError('client must be an ioredis or node-redis client, or a RedisCommandRunner');
}
