// A transactional handler that swallows a failed statement leaves its transaction aborted: Fastify
// answers 500 transaction_aborted and releases the key (the shared scenario: aborted-transaction-kit.ts).
// Was wrong: 503 store_unavailable with a store-error event, on every retry.
import { idempotency } from '@idem/fastify';
import type { PostgresTransaction } from '@idem/postgres';
import Fastify from 'fastify';
import { describeAbortedTransaction } from '../../core/test/support/aborted-transaction-kit.js';

await describeAbortedTransaction('fastify', async ({ store, onEvent, work }) => {
  const app = Fastify();
  await app.register(idempotency, { store, transactional: true, scope: () => 'user-1', onEvent, storeTimeout: '15s' });
  app.post('/charges', async (request, reply) => {
    await work(request.idempotency?.tx as PostgresTransaction, String(request.headers['idempotency-key']));
    return reply.code(201).send({ ok: true });
  });
  const url = await app.listen({ port: 0, host: '127.0.0.1' });
  return { url, close: () => app.close() };
});
