export * from './auth.js';
export * from './idempotency.js';
