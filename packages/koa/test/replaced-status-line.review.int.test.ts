// Koa sets the reason phrase with the status (`ctx.status = 201` is "201 Created"): idem's 500 in
// place of a refused COMMIT must not go out as "500 Created" (the shared scenario: replaced-status-line-kit.ts).
import http from 'node:http';
import { idempotency } from '@idem/koa';
import type { PostgresTransaction } from '@idem/postgres';
import Koa from 'koa';
import { describeReplacedStatusLine } from '../../core/test/support/replaced-status-line-kit.js';
import { listen } from '../../core/test/support/timeouts-kit.js';

await describeReplacedStatusLine('koa', 'Created', async ({ store, work }) => {
  const app = new Koa();
  app.silent = true;
  app.use(idempotency({ store, transactional: true, scope: () => 'user-1', storeTimeout: '15s' }));
  app.use(async (ctx) => {
    await work(ctx.state.idempotency?.tx as PostgresTransaction, String(ctx.get('idempotency-key')));
    ctx.status = 201;
    ctx.body = { ok: true };
  });
  return listen(http.createServer(app.callback()));
});
