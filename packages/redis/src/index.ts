export {
  type IoredisLike,
  type NodeRedisClientLike,
  type NodeRedisClusterLike,
  type RedisClientLike,
  type RedisCommandRunner,
  redisCommandRunner,
} from './command-runner.js';
export { type RedisStore, type RedisStoreOptions, redisStore } from './redis-store.js';
export { isResponseTooLargeError, ResponseTooLargeError } from './response-too-large-error.js';
