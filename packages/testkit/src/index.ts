export { type SkewedClock, skewedClock } from './clock.js';
export { type CutHow, type CutProxy, type CutProxyBytes, createCutProxy } from './cut-proxy.js';
export * from './describe-adapter.js';
export { type DescribeStoreOptions, describeStore, type StoreHarness } from './describe-store.js';
export { multipartForm } from './multipart-form.js';
export { frameRequest, parseAnswer, type RawAnswer, sendRaw } from './raw-http.js';
export { reachableText } from './reachable-text.js';
export { databaseUrl, postgresAnswers, redisAnswers, redisUrl, serviceAvailable } from './services.js';
export { createTcpProxy, type TcpProxy, type TcpProxyOptions } from './tcp-proxy.js';
export {
  type TransactionalMemoryOptions,
  type TransactionOutcome,
  transactionalMemoryStore,
} from './transactional-memory.js';
export { startWorkers, type Worker, type Workers, type WorkersOptions } from './workers.js';
