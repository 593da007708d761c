// A transactional handler that swallows a failed statement leaves its transaction aborted: Express
// answers 500 transaction_aborted and releases the key (the shared scenario: aborted-transaction-kit.ts).
// Was wrong: 503 store_unavailable with a store-error event, on every retry.
import http from 'node:http';
import { idempotency } from '@idem/express';
import type { PostgresTransaction } from '@idem/postgres';
import express from 'express';
import { describeAbortedTransaction } from '../../core/test/support/aborted-transaction-kit.js';
import { listen } from '../../core/test/support/timeouts-kit.js';

await describeAbortedTransaction('express', async ({ store, onEvent, work }) => {
  const app = express();
  app.post(
    '/charges',
    idempotency({ store, transactional: true, scope: () => 'user-1', onEvent, storeTimeout: '15s' }),
    express.json(),
    async (req, res) => {
      await work(req.idempotency?.tx as PostgresTransaction, String(req.get('idempotency-key')));
      res.status(201).json({ ok: true });
    },
  );
  return listen(http.createServer(app));
});
