/**
 * The one thing the store needs from a Redis client: send a command that touches one `key` and get
 * the raw reply, with bulk strings as `Buffer` (records hold bytes). Integers may come as numbers, or
 * as their digits in a string or bytes (ioredis with `stringNumbers: true`): the store reads them all.
 *
 * {@link redisStore} builds one from an ioredis `Redis` or `Cluster`, or a node-redis client or
 * cluster, so most callers never see this type. Implement it yourself to use any other client
 * (`key` is there so a cluster client can route the command to the key's slot). Reject with Redis's
 * error replies as an error whose class is named `ReplyError` or `ErrorReply` (as ioredis and
 * node-redis do): the store tells a Redis that refused the command (`NOPERM`, `WRONGTYPE`: a
 * `RedisCommandError`) from one it could not reach by that; any other rejection is unavailability.
 *
 * @example
 * const runner: RedisCommandRunner = {
 *   send: (key, args) => myClient.rawCommand(args, { returnBuffers: true }),
 * };
 * const store = redisStore({ client: runner });
 */
export interface RedisCommandRunner {
  send(key: string, args: readonly (string | Buffer)[]): Promise<unknown>;
  /**
   * Optional: sends `commands`, all for `key`, on one connection, one after the other and written
   * together (a pipeline: one round trip, no `MULTI`), and resolves with their replies in order, or
   * rejects with the first error reply. The store's `waitForReplicas` needs it: `WAIT` counts the
   * replicas that have the writes of the connection it is sent on, so it must follow the write on
   * the write's connection. {@link redisCommandRunner} provides it for every client it wraps.
   */
  sendPipeline?: ((key: string, commands: readonly (readonly (string | Buffer)[])[]) => Promise<unknown[]>) | undefined;
}
