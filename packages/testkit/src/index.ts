export * from './describe-adapter.js';
export { type DescribeStoreOptions, describeStore, type StoreHarness } from './describe-store.js';
