// A transactional handler that swallows a failed statement leaves its transaction aborted: Koa
// answers 500 transaction_aborted and releases the key (the shared scenario: aborted-transaction-kit.ts).
// Was wrong: 503 store_unavailable with a store-error event, on every retry.
import http from 'node:http';
import { idempotency } from '@idem/koa';
import type { PostgresTransaction } from '@idem/postgres';
import Koa from 'koa';
import { describeAbortedTransaction } from '../../core/test/support/aborted-transaction-kit.js';
import { listen } from '../../core/test/support/timeouts-kit.js';

await describeAbortedTransaction('koa', async ({ store, onEvent, work }) => {
  const app = new Koa();
  app.silent = true;
  app.use(idempotency({ store, transactional: true, scope: () => 'user-1', onEvent, storeTimeout: '15s' }));
  app.use(async (ctx) => {
    await work(ctx.state.idempotency?.tx as PostgresTransaction, String(ctx.get('idempotency-key')));
    ctx.status = 201;
    ctx.body = { ok: true };
  });
  return listen(http.createServer(app.callback()));
});
