// Defined in @idem/core since every store refuses oversized responses; still exported here.
export { isResponseTooLargeError, ResponseTooLargeError } from '@idem/core';
export {
  type IoredisLike,
  type NodeRedisClientLike,
  type NodeRedisClusterLike,
  type NodeRedisSentinelLike,
  type RedisClientLike,
  redisCommandRunner,
} from './command-runner.js';
export { RecordFormatError } from './record-codec.js';
export type { RedisCommandRunner } from './redis-command-runner.js';
export { type RedisStore, type RedisStoreOptions, type ReplicaWait, redisStore } from './redis-store.js';
export { RedisCommandError, UnexpectedReplyError } from './store-errors.js';
