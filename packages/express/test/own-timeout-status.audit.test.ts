// Mutation test of idempotencyErrors()' check for connect-timeout's error: only its 503 (with
// `code: 'ETIMEDOUT'` and the numeric `timeout` it waited) means the handler runs on. A handler's
// own error that looks alike but says another status (an HTTP client's 504 for an upstream that timed
// out) is the handler's failure, judged by the policy.
import { memoryStore } from '@idem/core';
import express from 'express';
import { expect, it } from 'vitest';
import { idempotency, idempotencyErrors } from '../src/index.js';
import { serve } from './support.js';

it("a handler's own ETIMEDOUT error with a timeout and status 504 is its failure: 'stripe' releases the key", async () => {
  let runs = 0;
  const app = express();
  app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', storeOutcome: 'stripe' }));
  app.post('/charges', (_req, _res, next) => {
    runs++;
    next(Object.assign(new Error('upstream timed out'), { code: 'ETIMEDOUT', timeout: 3_000, status: 504 }));
  });
  app.use(idempotencyErrors());
  await serve(app, async (url) => {
    const post = () => fetch(`${url}/charges`, { method: 'POST', headers: { 'idempotency-key': 'own-504' } });
    expect((await post()).status).toBe(504);
    // Released as a thrown handler under 'stripe': the retry runs it again, and gets its 504 too.
    const retry = await post();
    expect([retry.status, retry.headers.get('idempotent-replayed')]).toEqual([504, null]);
    expect(runs).toBe(2);
  });
});
