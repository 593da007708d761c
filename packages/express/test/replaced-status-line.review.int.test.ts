// A handler's own reason phrase (`res.statusMessage`): idem's 500 in place of a refused COMMIT must
// not go out with it (the shared scenario: replaced-status-line-kit.ts).
import http from 'node:http';
import { idempotency } from '@idem/express';
import type { PostgresTransaction } from '@idem/postgres';
import express from 'express';
import { describeReplacedStatusLine } from '../../core/test/support/replaced-status-line-kit.js';
import { listen } from '../../core/test/support/timeouts-kit.js';

await describeReplacedStatusLine('express', 'Created Fine', async ({ store, reason, work }) => {
  const app = express();
  app.post(
    '/charges',
    idempotency({ store, transactional: true, scope: () => 'user-1', storeTimeout: '15s' }),
    express.json(),
    async (req, res) => {
      await work(req.idempotency?.tx as PostgresTransaction, String(req.get('idempotency-key')));
      res.statusMessage = reason;
      res.status(201).json({ ok: true });
    },
  );
  return listen(http.createServer(app));
});
