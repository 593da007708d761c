import type { RedisCommandRunner } from './redis-command-runner.js';
import { runnerPool } from './runner-pool.js';

/**
 * The part of an ioredis `Redis` or `Cluster` the store uses.
 *
 * @example
 * import { Redis } from 'ioredis';
 * const store = redisStore({ client: new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379') }); // or new Cluster(nodes)
 */
export interface IoredisLike {
  callBuffer(command: string, ...args: (string | Buffer | number)[]): Promise<unknown>;
  /** Used by the store's `waitForReplicas` only. */
  pipeline?: (() => { exec(): Promise<[Error | null, unknown][] | null> }) | undefined;
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
  /**
   * A pool's (`createClientPool`): runs `task` with one of its clients. Used by the store's
   * `waitForReplicas` only, to send a write and its `WAIT` on one connection.
   */
  execute?: ((task: (client: NodeRedisClientLike) => Promise<unknown>) => Promise<unknown>) | undefined;
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
  /** Used by the store's `waitForReplicas` only: `withTypeMapping(...).multi(key)` pipelines. */
  withTypeMapping?: ((typeMapping: object) => unknown) | undefined;
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
  /** Used by the store's `waitForReplicas` only: `withTypeMapping(...).multi()` pipelines. */
  withTypeMapping?: ((typeMapping: object) => unknown) | undefined;
}

/**
 * Every client {@link redisStore} accepts: one client, or a non-empty array of ioredis clients (all
 * `Redis` or all `Cluster`, each a connection of its own to the same deployment), for the store to
 * spread its commands over.
 *
 * @example
 * const fromEnv = (client: RedisClientLike) => redisStore({ client, prefix: `${process.env.SERVICE}:idem:` });
 */
export type RedisClientLike =
  | IoredisLike
  | NodeRedisClientLike
  | NodeRedisClusterLike
  | NodeRedisSentinelLike
  | RedisCommandRunner
  | readonly IoredisLike[];

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
  if (Array.isArray(client)) return ioredisClients(client as readonly unknown[]);
  if (!client || (typeof client !== 'object' && typeof client !== 'function')) {
    throw new TypeError(
      'client must be an ioredis or node-redis client, a non-empty array of ioredis clients, or a RedisCommandRunner',
    );
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
      return {
        send: (key, args) => cluster.sendCommand(key, false, [...args], nodeRedisBuffers),
        // Not two sendCommand calls: each finds its node on its own, and a redirection between them
        // would send the WAIT to another node than the write. A pipeline goes to the key's node whole.
        ...nodeRedisPipeline(cluster),
      };
    }
    // A Sentinel client's sendCommand takes `isReadonly` first; taken for a plain client, it got the
    // options as the command and every call failed ("ERR Protocol error"). `getMasterNode` tells it apart.
    if (typeof candidate.getMasterNode === 'function') {
      const sentinel = client as NodeRedisSentinelLike;
      return {
        send: (_key, args) => sentinel.sendCommand(false, [...args], nodeRedisBuffers),
        // Not two sendCommand calls: the Sentinel client keeps a pool of connections to the primary
        // (masterPoolSize), and two commands may leave on two of them. A pipeline leaves on one.
        ...nodeRedisPipeline(sentinel),
      };
    }
    const single = client as NodeRedisClientLike;
    // A pool (createClientPool) has a sendCommand too, but hands each call to whichever of its
    // clients is free: the commands of one pipeline would leave on several connections, and a WAIT
    // would count the replicas of a connection that wrote nothing (at once, all of them). Its
    // `execute` lends one client for the whole pipeline.
    const execute = single.execute;
    return {
      send: (_key, args) => single.sendCommand([...args], nodeRedisBuffers),
      sendPipeline:
        typeof execute === 'function'
          ? (_key, commands) => execute.call(single, (one) => sendTogether(one, commands)) as Promise<unknown[]>
          : (_key, commands) => sendTogether(single, commands),
    };
  }
  throw new TypeError(
    'client must be an ioredis or node-redis client, a non-empty array of ioredis clients, or a RedisCommandRunner',
  );
}

/**
 * The runner over an array of ioredis clients: each command to the least busy (see runner-pool.ts),
 * or, for an array of one, that client's own runner, unchanged. What would make the clients disagree
 * on where a record lives is refused here, once: keys written under two prefixes or in two databases
 * would let two claims of one key both find it free.
 */
function ioredisClients(clients: readonly unknown[]): RedisCommandRunner {
  if (clients.length === 0) throw new TypeError('client is an empty array: give one ioredis client, or several');
  const kinds: string[] = [];
  clients.forEach((element, index) => {
    const candidate = (element ?? {}) as Partial<IoredisLike & NodeRedisClientLike & RedisCommandRunner>;
    if (typeof candidate.callBuffer !== 'function') {
      if (typeof candidate.sendCommand === 'function') {
        throw new TypeError(
          `client[${index}] is a node-redis client: an array takes ioredis clients only (a node-redis createClientPool is given as one client)`,
        );
      }
      throw new TypeError(
        `client[${index}] is not an ioredis client: an array takes ioredis Redis or Cluster clients only`,
      );
    }
    const first = clients.indexOf(element);
    if (first !== index) {
      throw new TypeError(
        `client[${index}] is client[${first}] again: each element must be a client, and a connection, of its own`,
      );
    }
    const kind = (element as { isCluster?: unknown }).isCluster === true ? 'Cluster' : 'Redis';
    kinds.push(kind);
    if (kind !== kinds[0]) {
      throw new TypeError(
        `client[${index}] is an ioredis ${kind} where client[0] is a ${kinds[0]}: give all Redis or all Cluster clients`,
      );
    }
    const { keyPrefix, db } = written(element);
    const firstWritten = written(clients[0]);
    if (keyPrefix !== firstWritten.keyPrefix) {
      throw new TypeError(
        `client[${index}] has keyPrefix '${keyPrefix}' where client[0] has '${firstWritten.keyPrefix}': every client must write a record under the same key`,
      );
    }
    if (db !== firstWritten.db) {
      throw new TypeError(
        `client[${index}] selects db ${db} where client[0] selects db ${firstWritten.db}: every client must write a record in the same database`,
      );
    }
  });
  const runners = clients.map((element) => ioredisRunner(element as IoredisLike));
  return runners.length === 1 ? (runners[0] as RedisCommandRunner) : runnerPool(runners);
}

// Where an ioredis client writes a key: its keyPrefix (a Cluster's own, or its redisOptions' one,
// which ioredis copies over) and, for a Redis, its database. Unset reads as ioredis's defaults.
const written = (client: unknown): { keyPrefix: string; db: number } => {
  const options = (client as { options?: { keyPrefix?: unknown; db?: unknown } }).options ?? {};
  return {
    keyPrefix: typeof options.keyPrefix === 'string' ? options.keyPrefix : '',
    db: typeof options.db === 'number' ? options.db : 0,
  };
};

/**
 * Sends `commands` through one plain node-redis client. It has one connection, and writes the
 * commands asked for in one tick together, in order: no pipeline object needed. Rejects with the
 * first error, as a pipeline does.
 */
async function sendTogether(client: NodeRedisClientLike, commands: readonly (readonly (string | Buffer)[])[]) {
  const settled = await Promise.allSettled(commands.map((args) => client.sendCommand([...args], nodeRedisBuffers)));
  const failed = settled.find((result) => result.status === 'rejected');
  if (failed !== undefined) throw failed.reason;
  return settled.map((result) => (result as PromiseFulfilledResult<unknown>).value);
}

// What node-redis's `multi()` (cluster or Sentinel) answers with, as far as the store uses it.
interface NodeRedisMulti {
  addCommand(...args: unknown[]): NodeRedisMulti;
  execAsPipeline(): Promise<unknown[]>;
}

/**
 * `sendPipeline` through node-redis's `withTypeMapping(buffers).multi(...)`, sent with
 * `execAsPipeline` (no MULTI/EXEC), or nothing when the client has no `withTypeMapping`. A cluster's
 * `addCommand` takes the routing key and `isReadonly` before the command, a Sentinel client's only
 * `isReadonly`. node-redis rejects a pipeline with a `MultiErrorReply` that holds every reply, or with
 * the first error itself: the store wants that first error either way (NOSCRIPT, OOM).
 */
function nodeRedisPipeline(
  client: NodeRedisClusterLike | NodeRedisSentinelLike,
): Pick<RedisCommandRunner, 'sendPipeline'> {
  if (typeof client.withTypeMapping !== 'function') return {};
  const cluster = Array.isArray((client as Partial<NodeRedisClusterLike>).masters);
  let buffered: { multi(routing?: string): NodeRedisMulti } | undefined;
  return {
    sendPipeline: async (key, commands) => {
      buffered ??= client.withTypeMapping?.(nodeRedisBuffers.typeMapping) as {
        multi(routing?: string): NodeRedisMulti;
      };
      // A cluster's multi takes the key that routes the pipeline; a Sentinel client's takes nothing.
      let multi = cluster ? buffered.multi(key) : buffered.multi();
      for (const args of commands) {
        multi = cluster ? multi.addCommand(key, false, [...args]) : multi.addCommand(false, [...args]);
      }
      try {
        return await multi.execAsPipeline();
      } catch (error) {
        const { replies, errorIndexes } = error as { replies?: unknown[]; errorIndexes?: number[] };
        const first = errorIndexes?.[0];
        throw first === undefined || replies === undefined ? error : replies[first];
      }
    },
  };
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
  const runner: RedisCommandRunner = {
    send: (_key, [command, ...args]) => {
      const method = methodOf(command as string);
      return method === undefined ? ioredis.callBuffer(command as string, ...args) : method(...args);
    },
  };
  if (typeof ioredis.pipeline !== 'function') return runner;
  // A pipeline leaves on one connection, written at once; on a Cluster it goes, whole, to the node
  // that owns its keys' slot (WAIT has none, so the write's key decides). Sent one by one, a
  // Cluster would send the keyless WAIT to any node.
  runner.sendPipeline = async (_key, commands) => {
    const pipeline = ioredis.pipeline?.() as unknown as Record<string, (...args: unknown[]) => unknown> & {
      exec(): Promise<[Error | null, unknown][] | null>;
    };
    for (const [command, ...args] of commands) {
      const buffered = pipeline[`${String(command).toLowerCase()}Buffer`];
      if (typeof buffered === 'function') buffered.apply(pipeline, args);
      else pipeline.callBuffer?.call(pipeline, command, ...args);
    }
    const replies = await pipeline.exec();
    return (replies ?? []).map(([error, reply]) => {
      if (error) throw error;
      return reply;
    });
  };
  return runner;
}
